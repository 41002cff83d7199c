package disktest

import (
	"io"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
)

func openFile(t *testing.T, fs *Files) core.DiskFile {
	t.Helper()
	f, err := fs.Open(core.DiskFileSpec{Dir: t.TempDir(), Group: 0})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	require.NoError(t, f.Reserve(64))
	return f
}

// An armed fault fails the next access it applies to with the error a real
// disk gives, and only that access.
func TestArmedFaultsFailWithDiskErrors(t *testing.T) {
	fs := New(Options{})
	f := openFile(t, fs)
	buf := make([]byte, 8)

	fs.FailNext(ReadEIO)
	_, err := f.WriteAt(buf, 0) // a write is not a read: it passes
	require.NoError(t, err)
	_, err = f.ReadAt(buf, 0)
	assert.ErrorIs(t, err, syscall.EIO)
	_, err = f.ReadAt(buf, 0)
	assert.NoError(t, err)

	fs.FailNext(ShortRead)
	n, err := f.ReadAt(buf, 0)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, 4, n)

	fs.FailNext(ShortWrite)
	n, err = f.WriteAt(buf, 0)
	assert.ErrorIs(t, err, io.ErrShortWrite)
	assert.Equal(t, 4, n)

	fs.FailNext(NoSpace)
	_, err = f.WriteAt(buf, 0)
	assert.ErrorIs(t, err, syscall.ENOSPC)

	fs.FailNext(WriteEIO)
	_, err = f.WriteAt(buf, 0)
	assert.ErrorIs(t, err, syscall.EIO)

	fs.FailNext(Denied)
	_, err = f.ReadAt(buf, 0)
	assert.ErrorIs(t, err, syscall.EACCES)
	fs.FailNext(Denied)
	_, err = f.WriteAt(buf, 0)
	assert.ErrorIs(t, err, syscall.EACCES)

	fs.FailNext(ReserveNoSpace)
	assert.ErrorIs(t, f.Reserve(128), syscall.ENOSPC)
	for _, ft := range Faults() {
		switch ft {
		case Truncate, Overwrite, FlipBit:
		case Denied:
			assert.Equal(t, 2, fs.Injected(ft), ft.String())
		default:
			assert.Equal(t, 1, fs.Injected(ft), ft.String())
		}
	}
}

// A truncation makes reads past the new end fail, and a read of cut bytes a
// later write covered again succeeds with zeros: SilentReads counts it.
func TestTruncationIsSeenAsEOFOrCountedSilent(t *testing.T) {
	fs := New(Options{Seed: 3})
	f := openFile(t, fs)
	blob := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	for off := int64(0); off < 64; off += 8 {
		_, err := f.WriteAt(blob, off)
		require.NoError(t, err)
	}
	fs.FailNext(Truncate)
	_, err := f.WriteAt(blob, 0) // cuts the file somewhere in [0, 64), then writes
	require.NoError(t, err)
	_, err = f.ReadAt(make([]byte, 8), 56)
	assert.ErrorIs(t, err, io.EOF, "the last blob is past the new end")

	_, err = f.WriteAt(blob, 56) // extends the file over the cut bytes
	require.NoError(t, err)
	silent := 0
	for off := int64(8); off < 56; off += 8 {
		got := make([]byte, 8)
		_, err := f.ReadAt(got, off)
		require.NoError(t, err)
		if string(got) != string(blob) {
			silent++
		}
	}
	assert.Positive(t, silent)
	assert.Equal(t, silent, fs.SilentReads())
}

// An overwrite by another process and a bit flipped on read change bytes
// without an error; SilentReads counts the reads that returned them.
func TestOverwriteAndBitFlipAreSilentAndCounted(t *testing.T) {
	fs := New(Options{Seed: 5})
	f := openFile(t, fs)
	blob := make([]byte, 64)
	_, err := f.WriteAt(blob, 0)
	require.NoError(t, err)

	fs.FailNext(FlipBit)
	got := make([]byte, 64)
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	assert.NotEqual(t, blob, got, "one bit differs")
	assert.Equal(t, 1, fs.SilentReads())

	fs.FailNext(Overwrite)
	_, err = f.WriteAt(blob[:1], 0) // junk lands somewhere in [0, 64), then this byte
	require.NoError(t, err)
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	assert.Equal(t, 1, fs.Injected(Overwrite))
	if string(got[1:]) != string(blob[1:]) {
		assert.Equal(t, 2, fs.SilentReads())
	}
}

// Rate injects only the listed faults, reproducibly for one seed.
func TestRateInjectsListedFaultsReproducibly(t *testing.T) {
	run := func() [numFaults]int {
		fs := New(Options{Seed: 9, Rate: 0.5, Faults: []Fault{ReadEIO, NoSpace}})
		f := openFile(t, fs)
		buf := make([]byte, 8)
		for range 100 {
			f.WriteAt(buf, 0)
			f.ReadAt(buf, 0)
		}
		return fs.injected
	}
	a := run()
	assert.Equal(t, a, run())
	assert.Positive(t, a[ReadEIO])
	assert.Positive(t, a[NoSpace])
	assert.Zero(t, a[ShortRead]+a[ShortWrite]+a[WriteEIO]+a[Truncate])
}

// OpenFiles counts the files not yet closed.
func TestOpenFilesCountsUnclosed(t *testing.T) {
	fs := New(Options{})
	f, err := fs.Open(core.DiskFileSpec{Dir: t.TempDir(), Group: 1})
	require.NoError(t, err)
	assert.Equal(t, 1, fs.OpenFiles())
	require.NoError(t, f.Close())
	assert.Zero(t, fs.OpenFiles())
}

// FillAfter lets writes store that many bytes, then fails every write with
// ENOSPC until Free.
func TestFillAfterFillsTheDiskUntilFree(t *testing.T) {
	fs := New(Options{})
	f := openFile(t, fs)
	buf := make([]byte, 8)
	fs.FillAfter(16)
	for range 2 {
		_, err := f.WriteAt(buf, 0)
		require.NoError(t, err)
	}
	_, err := f.WriteAt(buf, 0)
	assert.ErrorIs(t, err, syscall.ENOSPC)
	assert.Equal(t, 1, fs.Injected(NoSpace))
	fs.Free()
	_, err = f.WriteAt(buf, 0)
	assert.NoError(t, err)
}
