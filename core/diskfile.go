package core

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

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
	// Alignment is what ReadAt and WriteAt need their offsets, lengths and
	// buffer addresses to be multiples of: 1 for ordinary files, the
	// filesystem's block size for a file opened for direct I/O.
	Alignment() int64
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
	// Direct asks for direct I/O (O_DIRECT: no page cache, no writeback
	// throttling). An opener that cannot give it (tmpfs) opens the file
	// normally; Alignment says which it got.
	Direct bool
}

// DiskOpener opens the blob file spec names.
type DiskOpener func(spec DiskFileSpec) (DiskFile, error)

// WithDiskFiles makes the disk tier open its blob files with open instead of
// OSDiskFiles. It is the seam for fault injection (internal/testkit/disktest) and for
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
//
// With spec.Direct the file is opened with O_DIRECT where the filesystem
// supports it (Alignment 4096), and normally where it does not (EINVAL).
func OSDiskFiles(spec DiskFileSpec) (DiskFile, error) {
	if err := reclaimStaleDiskFiles(spec.Dir); err != nil {
		return nil, err
	}
	if spec.Persistent {
		name := filepath.Join(spec.Dir, fmt.Sprintf("kvcm-group%d.blob", spec.Group))
		f, err := openDirect(name, os.O_RDWR|os.O_CREATE, spec.Direct)
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
		return newOSDiskFile(f, true), nil
	}
	f, err := os.CreateTemp(spec.Dir, fmt.Sprintf("kvcm-group%d-*.blob", spec.Group))
	if err != nil {
		return nil, err
	}
	if spec.Direct {
		g, err := openDirect(f.Name(), os.O_RDWR, true)
		f.Close()
		if err != nil {
			os.Remove(f.Name())
			return nil, err
		}
		f = g
	}
	// A reclaimer that removes the file before this lock only unlinks it:
	// the open file keeps working.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return newOSDiskFile(f, false), nil
}

// directAlignment is the alignment O_DIRECT needs on the filesystems kvcm
// runs on (their logical block size is at most 4 KiB).
const directAlignment = 4096

// openDirect opens name with O_DIRECT when direct is set and the filesystem
// accepts it, and without it otherwise.
func openDirect(name string, flag int, direct bool) (*os.File, error) {
	if direct {
		f, err := os.OpenFile(name, flag|syscall.O_DIRECT, 0o600)
		if err == nil || !errors.Is(err, syscall.EINVAL) {
			return f, err
		}
	}
	return os.OpenFile(name, flag, 0o600)
}

func newOSDiskFile(f *os.File, keep bool) osDiskFile {
	align := int64(1)
	if fl, err := fcntlFlags(f); err == nil && fl&syscall.O_DIRECT != 0 {
		align = directAlignment
	}
	return osDiskFile{File: f, keep: keep, align: align}
}

func fcntlFlags(f *os.File) (int, error) {
	fl, _, errno := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), syscall.F_GETFL, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(fl), nil
}

// reclaimStaleDiskFiles removes the non-persistent blob files under dir that
// no live manager locks (left behind by a killed one).
func reclaimStaleDiskFiles(dir string) error {
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
	keep  bool
	align int64
}

func (f osDiskFile) Alignment() int64 { return f.align }

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

// VectorDiskFile is a DiskFile that also reads and writes several buffers at
// one offset in one call (preadv and pwritev), as the buffers laid end to
// end. The disk tier moves a run of consecutive slots, headers and payloads
// in place, in one such call; with a DiskFile that lacks the methods it
// makes one ReadAt or WriteAt per buffer instead. Short transfers come with
// an error, as in io.ReaderAt.
type VectorDiskFile interface {
	DiskFile
	ReadvAt(bufs [][]byte, off int64) (int, error)
	WritevAt(bufs [][]byte, off int64) (int, error)
}

func readvAt(f DiskFile, bufs [][]byte, off int64) error {
	if v, ok := f.(VectorDiskFile); ok {
		_, err := v.ReadvAt(bufs, off)
		return err
	}
	for _, b := range bufs {
		if _, err := f.ReadAt(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}

func writevAt(f DiskFile, bufs [][]byte, off int64) error {
	if v, ok := f.(VectorDiskFile); ok {
		_, err := v.WritevAt(bufs, off)
		return err
	}
	for _, b := range bufs {
		if _, err := f.WriteAt(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}

func (f osDiskFile) ReadvAt(bufs [][]byte, off int64) (int, error) {
	return vectored(bufs, off, func(iov [][]byte, off int64) (int, error) { return unix.Preadv(int(f.Fd()), iov, off) }, io.EOF)
}

func (f osDiskFile) WritevAt(bufs [][]byte, off int64) (int, error) {
	return vectored(bufs, off, func(iov [][]byte, off int64) (int, error) { return unix.Pwritev(int(f.Fd()), iov, off) }, io.ErrShortWrite)
}

// vectored calls op until every byte of bufs has moved, resuming after a
// partial transfer (on a copy of the iovecs, never the caller's); a call
// that moves nothing fails with short.
func vectored(bufs [][]byte, off int64, op func([][]byte, int64) (int, error), short error) (int, error) {
	total := 0
	iov, copied := bufs, false
	for len(iov) > 0 {
		n, err := op(iov, off)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, short
		}
		total += n
		off += int64(n)
		for n > 0 {
			if n >= len(iov[0]) {
				n -= len(iov[0])
				iov = iov[1:]
				continue
			}
			if !copied {
				iov, copied = slices.Clone(iov), true
			}
			iov[0] = iov[0][n:]
			n = 0
		}
	}
	return total, nil
}
