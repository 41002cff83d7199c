// Package device is the only part of kvcm that knows about accelerators.
//
// It defines one small interface for memory, streams, events, stream-ordered
// host functions and batch copies. Backends implement it: emu (a faithful host
// emulation, the default where there is no GPU) and, later, cuda.
//
// Asynchronous failure model. Work enqueued on a stream may fail after the call
// that enqueued it has returned. Such a failure is carried by events: an event
// reports (from Query and Synchronize) the first failure of the work enqueued on
// its stream between the previous Record on that stream and this Record,
// including failures inherited through Wait on a failed event. A later Record
// starts a clean interval, so one failed migration does not poison unrelated
// work that follows it. Stream.Synchronize reports the first failure since the
// previous Record or Synchronize on that stream.
package device

import (
	"errors"
	"fmt"
)

// Ptr is an address in the device's address space. For HostMapped memory it is
// also the host address of the same bytes.
type Ptr uintptr

// Add returns p advanced by n bytes.
func (p Ptr) Add(n int64) Ptr { return p + Ptr(n) }

// MemoryKind says where an allocation lives.
type MemoryKind int

const (
	// DeviceMemory is accelerator memory; the host reaches it only by copies.
	DeviceMemory MemoryKind = iota
	// HostMapped is page-locked host memory mapped into the device address
	// space at the same address as on the host.
	HostMapped
)

func (k MemoryKind) String() string {
	switch k {
	case DeviceMemory:
		return "device"
	case HostMapped:
		return "host-mapped"
	}
	return fmt.Sprintf("MemoryKind(%d)", int(k))
}

// Memory is one allocation. It is freed exactly once with Free; the caller must
// make sure no enqueued work still uses it.
type Memory interface {
	Ptr() Ptr
	Size() int64
	Kind() MemoryKind
	// Host returns the host view of HostMapped memory and nil for DeviceMemory.
	Host() []byte
	Free() error
}

// Growable is device memory reserved at a fixed base address whose usable
// size changes without moving it (CUDA's virtual memory management), so hot
// pools keep the addresses engines and codecs were given while a cache level
// is resized.
type Growable interface {
	Memory
	// Capacity is the reserved size, the most Resize may grow to.
	Capacity() int64
	// Resize commits or releases memory at the end so that Size becomes
	// size, in (0, Capacity]. The caller makes sure no enqueued work still
	// uses a released tail.
	Resize(size int64) error
}

// CopyDesc is one copy of Size bytes from Src to Dst; both may be device or
// host-mapped addresses.
type CopyDesc struct {
	Dst, Src Ptr
	Size     int64
}

// Stream is an ordered queue of asynchronous work.
type Stream interface {
	// BatchCopy enqueues all descriptors as one submission. On a synchronous
	// error nothing is enqueued. A backend whose host memory is registered in
	// regions splits a descriptor at a region boundary itself; callers never
	// split for that reason.
	BatchCopy(descs []CopyDesc) error
	// CopyFromHost enqueues a copy of src into device-accessible memory at
	// dst. src is ordinary (pageable) host memory that the call consumes
	// before it returns, so the caller may reuse it at once; the copy itself
	// runs in stream order. This is the index upload of device-index codecs
	// (one cuMemcpyBatchAsync entry with SRC_ACCESS_ORDER_DURING_API_CALL).
	CopyFromHost(dst Ptr, src []byte) error
	// HostFunc enqueues fn to run on a host thread in stream order. A non-nil
	// return is an asynchronous failure of the stream (see the package doc).
	HostFunc(fn func() error) error
	// Record captures the work enqueued so far into ev.
	Record(ev Event) error
	// Wait makes work enqueued later wait until ev has completed, as
	// captured by its latest Record at the time of this call (re-recording ev
	// later does not affect this wait). A failure carried by ev is inherited
	// by this stream's current interval.
	Wait(ev Event) error
	// Synchronize blocks until all enqueued work has completed. It does not
	// start a new event interval: a failure it reports is still carried by the
	// next Record.
	Synchronize() error
	// Handle is the native handle of the stream (a CUstream for cuda, an
	// opaque nonzero token for emu), as handed to codecs.
	Handle() uintptr
	Close() error
}

// HostWaiter is implemented by a Stream that can wait for the host without a
// host function. WaitHost makes work enqueued later wait until done is
// closed, holding no host-function thread meanwhile: on CUDA the host
// functions of every stream may share one driver thread, so a host function
// that blocks delays every stream's. A backend without it is waited for in a
// host function. done must be closed eventually: until then the stream, and
// a Close or Synchronize of it or of its device, waits.
type HostWaiter interface {
	WaitHost(done <-chan struct{}) error
}

// Event is a completion point in a stream.
type Event interface {
	// Query reports whether the recorded work has completed and, if so, its
	// failure. An event never recorded is complete.
	Query() (done bool, err error)
	// Synchronize blocks until the recorded work has completed.
	Synchronize() error
	Close() error
}

// Device is one accelerator (or its emulation).
type Device interface {
	Name() string
	Alloc(kind MemoryKind, size int64) (Memory, error)
	// Reserve reserves capacity bytes of device address space and commits
	// the first size of them.
	Reserve(size, capacity int64) (Growable, error)
	NewStream() (Stream, error)
	NewEvent() (Event, error)
	// StreamFromHandle returns the Stream whose Handle is h, for streams this
	// device created or adopted; codecs receive handles and enqueue work
	// through it.
	StreamFromHandle(h uintptr) (Stream, error)
	// AdoptStream returns a Stream over a native stream the engine owns and
	// the device did not create: on CUDA a CUstream of the device's context
	// (0, the legacy default stream, included); on the emulation any value,
	// each its own emulated stream, made on first use. Adopting a handle again
	// returns the same Stream, and StreamFromHandle finds it. The device never
	// destroys an adopted stream's native stream; the engine must keep it
	// alive while the device uses it.
	AdoptStream(h uintptr) (Stream, error)
	Close() error
}

// Errors shared by backends.
var (
	ErrOutOfMemory   = errors.New("device: out of memory")
	ErrInvalidCopy   = errors.New("device: copy outside any live allocation")
	ErrClosed        = errors.New("device: use after close")
	ErrInjected      = errors.New("device: injected failure")
	ErrUnknownStream = errors.New("device: unknown stream handle")
)
