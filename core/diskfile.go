package core

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/kvcm/kvcm/core/layout"
)

// DiskFile is one blob file of a disk tier: the slots of one cold pool group,
// each at offset slot × cold page bytes. ReadAt and WriteAt follow io.ReaderAt
// and io.WriterAt (a short read or write comes with an error); the manager
// calls them on host threads in stream order, never concurrently for one file.
type DiskFile interface {
	io.ReaderAt
	io.WriterAt
	// Reserve makes the file size bytes long with its space allocated, so a
	// full disk fails here rather than in a later write.
	Reserve(size int64) error
	// Close releases the file. A blob file holds only this manager's pages,
	// so an implementation may delete it.
	Close() error
}

// DiskOpener creates the blob file of cold pool group group of a disk tier
// whose directory is dir.
type DiskOpener func(dir string, group layout.PoolGroupIndex) (DiskFile, error)

// WithDiskFiles makes the disk tier create its blob files with open instead
// of OSDiskFiles. It is the seam for fault injection (internal/testkit/disktest) and for
// alternative file systems; every disk access of the manager goes through the
// files open returns.
func WithDiskFiles(open DiskOpener) Option { return func(o *options) { o.diskFiles = open } }

// OSDiskFiles is the default DiskOpener: a new temporary file in dir, named
// kvcm-group<group>-*.blob, whose Reserve truncates and fallocates it and
// whose Close closes and removes it.
func OSDiskFiles(dir string, group layout.PoolGroupIndex) (DiskFile, error) {
	f, err := os.CreateTemp(dir, fmt.Sprintf("kvcm-group%d-*.blob", group))
	if err != nil {
		return nil, err
	}
	return osDiskFile{f}, nil
}

type osDiskFile struct{ *os.File }

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

func (f osDiskFile) Close() error {
	err := f.File.Close()
	return errors.Join(err, os.Remove(f.Name()))
}
