// Package cuda is the CUDA backend of device.Device, kvcm's only contact with
// a real GPU.
//
// The driver is loaded at run time: dlopen("libcuda.so.1"), then every entry
// point through cuGetProcAddress at the CUDA 12.0 ABI, and cuMemcpyBatchAsync
// at the ABI of the driver (the CUDA 13.0 _v2 signature without failIdx, the
// CUDA 12.8 one with it, or none before 12.8). Building needs cgo but no CUDA
// headers or libraries, and the package loads on a machine without a GPU:
// New then fails with an error wrapping ErrUnavailable, never a crash or an
// exit. Without cgo the package builds too and OpenDevice always fails.
//
// Context. A Device uses the primary context of its GPU (retained in New,
// released in Close) and makes it current on the calling OS thread at the
// start of every driver call sequence, inside the same C call, so goroutines
// moving between threads never matter. Other users of the primary context in
// the process (the CUDA runtime of an engine) share it.
//
// Memory. DeviceMemory is cuMemAlloc. HostMapped memory is an anonymous
// mapping registered with cuMemHostRegister(PORTABLE|DEVICEMAP) in regions of
// at most 2 GiB (Options.HostRegionBytes) from its base; each region's device
// address is checked to equal its host address (unified addressing), so a
// Ptr is both. BatchCopy splits a descriptor only where it crosses a region
// boundary of a host-mapped allocation, as the device interface requires.
//
// Copies. BatchCopy validates every descriptor against the live allocations
// of the device (device.ErrInvalidCopy otherwise, with nothing enqueued) and
// submits the whole batch as one cuMemcpyBatchAsync with stream-ordered source
// access and CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE; before CUDA 12.8 (or
// with Options.ForceLegacyCopies) it issues one cuMemcpyAsync per descriptor.
// CopyFromHost is one batch entry with CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL
// (the source is consumed before the call returns); before 12.8 it launches
// kernels/upload.cu's kvcm_upload_segment, whose parameters carry the bytes.
//
// Failure model. Exactly the device package's: an event reports the first
// failure of the work between the previous Record on its stream and its own
// Record, inherited through Wait; Stream.Synchronize the first since the
// previous Record or Synchronize. Failures of the work come from host
// functions (a non-nil return or a panic) and from the driver. The backend
// keeps the bookkeeping on the host: each stream has a current interval;
// a host function fails the interval that was current when it was enqueued;
// Record hands the interval to the event and starts a new one; Wait on an
// event whose interval could carry a failure enqueues, after the
// cuStreamWaitEvent, a host function that copies that failure into the
// waiting stream's interval. Intervals with no host function cost nothing:
// their events are plain CUDA events. A driver error of the work itself
// (a faulting kernel or copy) is sticky in CUDA: every later query of the
// context reports it, and so do events and Synchronize here.
//
// Host functions run on a driver thread (cuLaunchHostFunc calls an exported
// Go function with a cgo.Handle) and must not call the device or CUDA in any
// way; they may take Go locks, read and write host memory, do file I/O.
//
// Beyond device.Device the package offers what the GPU codecs and the
// benchmarks need: kernel modules (LoadModule, Function, Stream.Launch),
// timing events (NewTimingEvent, ElapsedTime), Stream.Memset, raw batches
// (RawBatch) for measuring the driver alone, and Properties.
package cuda

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/device"
)

// ErrUnavailable is wrapped by every error New (and OpenDevice) returns when
// there is no usable CUDA driver or GPU: libcuda.so.1 missing, cuInit failing,
// no device, the ordinal out of range, a device without unified addressing or
// host-memory mapping, or a build without cgo.
var ErrUnavailable = errors.New("cuda: no usable CUDA driver or GPU")

// ErrDoubleFree is returned by Memory.Free on an allocation already freed.
var ErrDoubleFree = errors.New("cuda: allocation already freed")

// DefaultLibrary is the driver library New opens by default.
const DefaultLibrary = "libcuda.so.1"

// MaxHostRegionBytes is the largest (and default) registration region of
// host-mapped memory: 2 GiB.
const MaxHostRegionBytes int64 = 2 << 30

// Options configure New. The zero value opens device 0 with the defaults.
type Options struct {
	// Ordinal is the CUDA device ordinal.
	Ordinal int
	// LibraryPath is the driver library to open; "" means DefaultLibrary.
	// Once a library has been loaded successfully the process keeps it, and
	// this field no longer matters.
	LibraryPath string
	// HostRegionBytes is the size of the regions host-mapped allocations are
	// registered in: 0 means MaxHostRegionBytes; otherwise a positive multiple
	// of the OS page size, at most MaxHostRegionBytes. Tests use small
	// regions to exercise descriptor splitting at region boundaries.
	HostRegionBytes int64
	// ForceLegacyCopies makes BatchCopy and CopyFromHost use the pre-12.8
	// paths (one cuMemcpyAsync per descriptor; the upload kernel) even where
	// cuMemcpyBatchAsync exists, to test and measure them.
	ForceLegacyCopies bool
}

// BatchMode is how a Device submits BatchCopy.
type BatchMode int

const (
	// BatchLegacy is one cuMemcpyAsync per descriptor (drivers before 12.8).
	BatchLegacy BatchMode = iota
	// Batch12080 is cuMemcpyBatchAsync with the CUDA 12.8 signature (failIdx).
	Batch12080
	// Batch13000 is cuMemcpyBatchAsync with the CUDA 13.0 signature (_v2).
	Batch13000
)

func (m BatchMode) String() string {
	switch m {
	case BatchLegacy:
		return "cuMemcpyAsync per descriptor (pre-12.8 fallback)"
	case Batch12080:
		return "cuMemcpyBatchAsync (CUDA 12.8 ABI, failIdx)"
	case Batch13000:
		return "cuMemcpyBatchAsync (CUDA 13.0 ABI, _v2)"
	}
	return fmt.Sprintf("BatchMode(%d)", int(m))
}

// Properties describe an open Device.
type Properties struct {
	Name                        string
	Ordinal                     int
	ComputeMajor, ComputeMinor  int
	Multiprocessors             int
	MaxThreadsPerMultiprocessor int
	TotalMemory                 int64
	// DriverVersion is cuDriverGetVersion's value, e.g. 13000 for 13.0.
	DriverVersion   int
	BatchMode       BatchMode
	HostRegionBytes int64
}

// Error is a failed CUDA driver call.
type Error struct {
	// Op names the call and what it was doing.
	Op string
	// Result is the CUresult.
	Result int
	// Name is the CUresult's name from cuGetErrorName (CUDA_ERROR_...), or
	// "CUresult(n)" when the driver cannot name it.
	Name string
	// Description is cuGetErrorString's text, if any.
	Description string
}

// Error names the call, the result's name and its number ("CUresult N",
// which the bindings read back as the CUDA error code), and the driver's
// description.
func (e *Error) Error() string {
	if e.Description != "" {
		return fmt.Sprintf("cuda: %s: %s [CUresult %d] (%s)", e.Op, e.Name, e.Result, e.Description)
	}
	return fmt.Sprintf("cuda: %s: %s [CUresult %d]", e.Op, e.Name, e.Result)
}

// Is makes errors.Is(err, device.ErrOutOfMemory) hold for
// CUDA_ERROR_OUT_OF_MEMORY.
func (e *Error) Is(target error) bool {
	return target == device.ErrOutOfMemory && e.Result == cudaErrorOutOfMemory
}

const (
	cudaErrorOutOfMemory = 2
	cudaErrorNotReady    = 600
)
