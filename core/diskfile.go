package core

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kvcm/kvcm/core/layout"
)

// DiskFile is one blob file of a disk tier: the slots of one cold pool group,
// slot s at offset s × the group's slot stride (a blob header and the cold
// page, see core/blob). ReadAt and WriteAt follow io.ReaderAt and io.WriterAt
// (a short read or write comes with an error); the manager calls them from
// host functions of its disk stream, several at once for one file (a bounded
// queue of blobs, at distinct offsets), as os.File allows.
type DiskFile interface {
	io.ReaderAt
	io.WriterAt
	// Reserve makes the file size bytes long with its space allocated, so a
	// full disk fails here rather than in a later write. Bytes below size
	// that the file already held are kept.
	Reserve(size int64) error
	// Size is the file's current length: a persistent file may hold the
	// blobs an earlier manager left.
	Size() (int64, error)
	// Close releases the file. A file that is not persistent holds only this
	// manager's pages, so an implementation deletes it; a persistent one
	// stays for the next manager.
	Close() error
}

// DiskFileSpec names the blob file of one cold pool group of a disk tier.
type DiskFileSpec struct {
	// Dir is the disk tier's directory.
	Dir   string
	Group layout.PoolGroupIndex
	// Persistent: the file outlives the manager, and the next manager on Dir
	// with the same layout reuses its blobs (config.CacheTierConfig.Persistent).
	Persistent bool
}

// DiskOpener opens the blob file spec names.
type DiskOpener func(spec DiskFileSpec) (DiskFile, error)

// WithDiskFiles makes the disk tier open its blob files with open instead of
// OSDiskFiles. It is the seam for fault injection (core/disktest) and for
// alternative file systems; every disk access of the manager goes through the
// files open returns.
func WithDiskFiles(open DiskOpener) Option { return func(o *options) { o.diskFiles = open } }

// ErrDiskInUse: another live manager holds the persistent disk tier's
// directory (its blob file is locked).
var ErrDiskInUse = errors.New("disk tier directory in use by another manager")

// OSDiskFiles is the default DiskOpener. Every file it opens holds an
// exclusive flock for its lifetime, which dies with the process, so a file
// nobody locks was left by a dead manager.
//
// A file that is not persistent is a new file kvcm-group<group>-*.blob in the
// directory, removed at Close. Before creating one, OSDiskFiles removes the
// unlocked kvcm-group*-*.blob files of managers that were killed, so a
// restart after kill -9 finds its space again.
//
// A persistent file is kvcm-group<group>.blob, created when missing and kept
// at Close; a locked one fails with ErrDiskInUse.
func OSDiskFiles(spec DiskFileSpec) (DiskFile, error) {
	if err := ReclaimStaleDiskFiles(spec.Dir); err != nil {
		return nil, err
	}
	if spec.Persistent {
		name := filepath.Join(spec.Dir, fmt.Sprintf("kvcm-group%d.blob", spec.Group))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: %s is locked", ErrDiskInUse, name)
			}
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		return osDiskFile{File: f, keep: true}, nil
	}
	f, err := os.CreateTemp(spec.Dir, fmt.Sprintf("kvcm-group%d-*.blob", spec.Group))
	if err != nil {
		return nil, err
	}
	// A reclaimer that removes the file before this lock only unlinks it:
	// the open file keeps working.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return osDiskFile{File: f}, nil
}

// ReclaimStaleDiskFiles removes the non-persistent blob files under dir that
// no live manager locks (left behind by a killed one).
func ReclaimStaleDiskFiles(dir string) error {
	names, err := filepath.Glob(filepath.Join(dir, "kvcm-group*-*.blob"))
	if err != nil {
		return err
	}
	for _, name := range names {
		f, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			continue // gone meanwhile, or not ours to open
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
				f.Close()
				return fmt.Errorf("reclaim stale blob file: %w", err)
			}
		}
		f.Close()
	}
	return nil
}

type osDiskFile struct {
	*os.File
	keep bool
}

func (f osDiskFile) Reserve(size int64) error {
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("size blob file to %d bytes: %w", size, err)
	}
	err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
		return fmt.Errorf("reserve %d bytes: %w", size, err)
	}
	return nil
}

func (f osDiskFile) Size() (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (f osDiskFile) Close() error {
	if f.keep {
		// Durable before the next manager trusts it.
		return errors.Join(f.Sync(), f.File.Close())
	}
	err := f.File.Close()
	return errors.Join(err, os.Remove(f.Name()))
}
