// Package disktest is a fault-injecting file layer for the disk tier of
// core.Manager: hand Files.Open to core.WithDiskFiles and the tier's blob
// files (real files, from core.OSDiskFiles) fail on demand or at a seeded
// random rate with the errors a real disk gives: EIO, short reads and writes,
// a full disk, revoked permissions, and silent damage (truncation, bytes
// overwritten by another process, bits flipped on read) that only the blob
// checksums catch.
package disktest

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/kvcm/kvcm/core"
)

// Fault is one way a disk access fails.
type Fault int

const (
	// ReadEIO: a ReadAt reads nothing and fails with EIO.
	ReadEIO Fault = iota
	// ShortRead: a ReadAt reads the first half and fails with
	// io.ErrUnexpectedEOF.
	ShortRead
	// WriteEIO: a WriteAt writes nothing and fails with EIO.
	WriteEIO
	// ShortWrite: a WriteAt writes the first half and fails with
	// io.ErrShortWrite.
	ShortWrite
	// NoSpace: a WriteAt writes nothing and fails with ENOSPC.
	NoSpace
	// ReserveNoSpace: a Reserve (file creation or level resize) fails with
	// ENOSPC, changing nothing.
	ReserveNoSpace
	// Truncate: before a WriteAt, which then succeeds, the file is cut to a
	// random length, as by another process. Reads past the end fail with
	// io.EOF; bytes cut and later covered again by a write past them read
	// as zeros without error (counted by SilentReads).
	Truncate
	// Overwrite: before a WriteAt, which then succeeds, a random span of up
	// to 4 KiB of the reserved file is overwritten with random bytes, as by
	// another process.
	Overwrite
	// FlipBit: a ReadAt succeeds with one random bit of what it read
	// flipped, as from a disk or filesystem that corrupts data.
	FlipBit
	// Denied: a ReadAt or WriteAt fails with EACCES, as when the file's
	// permissions were revoked under the running manager (a network
	// filesystem re-checks them).
	Denied
	numFaults
)

var faultNames = [numFaults]string{
	"read-eio", "short-read", "write-eio", "short-write", "no-space", "reserve-no-space", "truncate",
	"overwrite", "flip-bit", "denied",
}

func (f Fault) String() string {
	if f >= 0 && f < numFaults {
		return faultNames[f]
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// Faults lists every fault.
func Faults() []Fault {
	out := make([]Fault, numFaults)
	for i := range out {
		out[i] = Fault(i)
	}
	return out
}

func (f Fault) onRead() bool { return f == ReadEIO || f == ShortRead || f == FlipBit || f == Denied }
func (f Fault) onWrite() bool {
	return f == WriteEIO || f == ShortWrite || f == NoSpace || f == Truncate || f == Overwrite || f == Denied
}
func (f Fault) onReserve() bool { return f == ReserveNoSpace }

// Options configure Files. The zero value injects nothing until FailNext.
type Options struct {
	// Seed seeds the random choice of faults and truncation lengths.
	Seed uint64
	// Rate is the probability that one access (read, write or reserve) gets
	// a random fault among Faults that applies to it, clamped to [0, 1].
	Rate float64
	// Faults are the faults Rate picks from; nil means all.
	Faults []Fault
}

// Files creates blob files that fail as configured. It is safe for
// concurrent use.
type Files struct {
	mu       sync.Mutex
	rng      *rand.Rand
	rate     float64
	faults   []Fault
	armed    []Fault
	injected [numFaults]int
	silent   int
	open     int
	// room is the bytes writes may still add before the disk is full; -1
	// means unlimited (see FillAfter).
	room int64
}

// New returns Files configured by opts.
func New(opts Options) *Files {
	faults := slices.Clone(opts.Faults)
	if faults == nil {
		faults = Faults()
	}
	return &Files{
		rng:    rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		rate:   min(max(opts.Rate, 0), 1),
		faults: faults,
		room:   -1,
	}
}

// Open is a core.DiskOpener: a core.OSDiskFiles file wrapped with the faults.
// It never asks for direct I/O, so the faults may cut and overwrite any
// byte range.
func (fs *Files) Open(spec core.DiskFileSpec) (core.DiskFile, error) {
	spec.Direct = false
	inner, err := core.OSDiskFiles(spec)
	if err != nil {
		return nil, err
	}
	fs.mu.Lock()
	fs.open++
	fs.mu.Unlock()
	return &file{fs: fs, inner: inner}, nil
}

// FailNext arms f: the next access it applies to fails with it, before any
// random fault. Armed faults are consumed in the order they were armed.
func (fs *Files) FailNext(f Fault) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.armed = append(fs.armed, f)
}

// FillAfter makes the disk full once writes have stored n more bytes: from
// then on every WriteAt fails with ENOSPC (counted as NoSpace) until Free.
// FillAfter(0) fills it at once, as another process would.
func (fs *Files) FillAfter(n int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.room = max(n, 0)
}

// Free ends FillAfter: the disk has room again.
func (fs *Files) Free() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.room = -1
}

// Injected is how many times f was injected.
func (fs *Files) Injected(f Fault) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.injected[f]
}

// SilentReads counts reads that returned no error although a truncation,
// an overwrite or a bit flip had damaged some of their bytes: wrong data only
// an integrity check can catch.
func (fs *Files) SilentReads() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.silent
}

// OpenFiles is how many files Open created and nobody closed yet.
func (fs *Files) OpenFiles() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.open
}

// pick returns the fault for one access, or -1.
func (fs *Files) pick(applies func(Fault) bool) Fault {
	if i := slices.IndexFunc(fs.armed, applies); i >= 0 {
		f := fs.armed[i]
		fs.armed = slices.Delete(fs.armed, i, i+1)
		fs.injected[f]++
		return f
	}
	if fs.rate == 0 || fs.rng.Float64() >= fs.rate {
		return -1
	}
	var cands []Fault
	for _, f := range fs.faults {
		if applies(f) {
			cands = append(cands, f)
		}
	}
	if len(cands) == 0 {
		return -1
	}
	f := cands[fs.rng.IntN(len(cands))]
	fs.injected[f]++
	return f
}

// span is a byte range [lo, hi) of a file.
type span struct{ lo, hi int64 }

type file struct {
	fs     *Files
	inner  core.DiskFile
	size   int64  // the length the manager reserved
	holes  []span // bytes a truncation cut and no write restored
	closed bool
}

func ioErr(op string, err error) error {
	return &os.PathError{Op: op, Path: "disktest", Err: err}
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	fault := f.fs.pick(Fault.onRead)
	silent := false
	if fault < 0 {
		silent = overlaps(f.holes, span{off, off + int64(len(p))})
	}
	f.fs.mu.Unlock()
	switch fault {
	case ReadEIO:
		return 0, ioErr("read", syscall.EIO)
	case Denied:
		return 0, ioErr("read", syscall.EACCES)
	case FlipBit:
		n, err := f.inner.ReadAt(p, off)
		if n > 0 {
			f.fs.mu.Lock()
			bit := f.fs.rng.IntN(8 * n)
			f.fs.silent++
			f.fs.mu.Unlock()
			p[bit/8] ^= 1 << (bit % 8)
		}
		return n, err
	case ShortRead:
		n, err := f.inner.ReadAt(p[:len(p)/2], off)
		if err == nil {
			err = fmt.Errorf("disktest: injected short read: %w", io.ErrUnexpectedEOF)
		}
		return n, err
	}
	n, err := f.inner.ReadAt(p, off)
	if err == nil && silent {
		f.fs.mu.Lock()
		f.fs.silent++
		f.fs.mu.Unlock()
	}
	return n, err
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	if f.fs.room >= 0 {
		if f.fs.room < int64(len(p)) {
			f.fs.room = 0
			f.fs.injected[NoSpace]++
			f.fs.mu.Unlock()
			return 0, ioErr("write", syscall.ENOSPC)
		}
		f.fs.room -= int64(len(p))
	}
	fault := f.fs.pick(Fault.onWrite)
	cut := int64(-1)
	if fault == Truncate && f.size > 0 {
		cut = f.fs.rng.Int64N(f.size)
	}
	var junk []byte
	var junkAt int64
	if fault == Overwrite && f.size > 0 {
		junk = make([]byte, 1+f.fs.rng.IntN(4096))
		for i := range junk {
			junk[i] = byte(f.fs.rng.Uint32())
		}
		junkAt = f.fs.rng.Int64N(f.size)
		junk = junk[:min(int64(len(junk)), f.size-junkAt)]
	}
	f.fs.mu.Unlock()
	switch fault {
	case WriteEIO:
		return 0, ioErr("write", syscall.EIO)
	case Denied:
		return 0, ioErr("write", syscall.EACCES)
	case NoSpace:
		return 0, ioErr("write", syscall.ENOSPC)
	case ShortWrite:
		n, err := f.inner.WriteAt(p[:len(p)/2], off)
		f.written(off, n)
		if err == nil {
			err = fmt.Errorf("disktest: injected short write: %w", io.ErrShortWrite)
		}
		return n, err
	}
	if cut >= 0 {
		if err := truncate(f.inner, cut); err != nil {
			return 0, err
		}
		f.fs.mu.Lock()
		f.holes = add(f.holes, span{cut, f.size})
		f.fs.mu.Unlock()
	}
	if len(junk) > 0 {
		if _, err := f.inner.WriteAt(junk, junkAt); err != nil {
			return 0, err
		}
		f.fs.mu.Lock()
		f.holes = add(f.holes, span{junkAt, junkAt + int64(len(junk))})
		f.fs.mu.Unlock()
	}
	n, err := f.inner.WriteAt(p, off)
	f.written(off, n)
	return n, err
}

func (f *file) Size() (int64, error) { return f.inner.Size() }

func (f *file) Alignment() int64 { return f.inner.Alignment() }

// truncate cuts the real file under the manager's feet.
func truncate(inner core.DiskFile, size int64) error {
	t, ok := inner.(interface{ Truncate(int64) error })
	if !ok {
		return fmt.Errorf("disktest: %T cannot be truncated", inner)
	}
	return t.Truncate(size)
}

func (f *file) written(off int64, n int) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	f.holes = subtract(f.holes, span{off, off + int64(n)})
}

func (f *file) Reserve(size int64) error {
	f.fs.mu.Lock()
	fault := f.fs.pick(Fault.onReserve)
	f.fs.mu.Unlock()
	if fault == ReserveNoSpace {
		return ioErr("fallocate", syscall.ENOSPC)
	}
	if err := f.inner.Reserve(size); err != nil {
		return err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	f.size = size
	f.holes = subtract(f.holes, span{size, 1 << 62})
	return nil
}

func (f *file) Close() error {
	f.fs.mu.Lock()
	if !f.closed {
		f.closed = true
		f.fs.open--
	}
	f.fs.mu.Unlock()
	return f.inner.Close()
}

func overlaps(set []span, s span) bool {
	for _, h := range set {
		if h.lo < s.hi && s.lo < h.hi {
			return true
		}
	}
	return false
}

func add(set []span, s span) []span {
	if s.lo >= s.hi {
		return set
	}
	return append(subtract(set, s), s)
}

func subtract(set []span, s span) []span {
	if s.lo >= s.hi {
		return set
	}
	var out []span
	for _, h := range set {
		if h.hi <= s.lo || s.hi <= h.lo {
			out = append(out, h)
			continue
		}
		if h.lo < s.lo {
			out = append(out, span{h.lo, s.lo})
		}
		if s.hi < h.hi {
			out = append(out, span{s.hi, h.hi})
		}
	}
	return out
}
