// Package emu is the host emulation of device.Device: the default backend where
// there is no GPU, so everything above it runs in CI.
//
// It is faithful rather than fast. Device memory is host memory from anonymous
// mmap that the host never sees directly (Memory.Host is nil); host-mapped
// memory is the same kind of mapping, returned by Host, and its Ptr is the real
// host address of its bytes. Each stream is an ordered queue served by its own
// goroutine, so copies and host functions really run after the enqueuing call
// has returned and concurrently with other streams. Events are real completion
// points that carry failures exactly as the device package doc describes. A
// Record, a Wait on a completed event or a Synchronize that finds its stream
// idle (nothing queued or running, no Options.MaxDelay) has nothing to wait
// for: the calling goroutine completes it at once, as a GPU would, instead of
// waking the stream's goroutine.
//
// To expose ordering and failure-handling bugs, a Device can delay every
// operation by a seeded random amount (Options.MaxDelay), fail copies at random
// (Options.FailRate) or on demand (FailNext), and it counts what it was asked to
// do (Stats) so that tests of other packages can assert on submissions.
//
// Ptr values are resolved through a registry of live allocations, never by
// converting them to pointers, so a copy that names freed memory is an error
// (synchronous when submitted, asynchronous when the memory is freed while the
// copy is queued) and never a crash. Like a real device, the emulator cannot
// tell a stale Ptr from a new allocation that the OS placed at the same
// address.
package emu

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcm/kvcm/core/device"
)

// ErrDoubleFree is returned by Memory.Free on an allocation already freed.
var ErrDoubleFree = errors.New("emu: allocation already freed")

// Options configure a Device. The zero value is a plain, unlimited, fault-free
// emulation.
type Options struct {
	// Seed seeds the random delays and random failures. Each stream draws from
	// its own generator, derived from Seed and the stream's creation order, so
	// a stream's sequence of draws is reproducible.
	Seed int64
	// MaxDelay makes every stream operation sleep a random duration in
	// [0, MaxDelay) before it runs. Zero or negative means no delay.
	MaxDelay time.Duration
	// FailRate is the probability that one executed copy descriptor fails
	// asynchronously with device.ErrInjected instead of copying. It is clamped
	// to [0, 1].
	FailRate float64
	// DeviceMemoryLimit and HostMemoryLimit cap the live bytes of each kind;
	// an Alloc beyond the cap fails with device.ErrOutOfMemory. Zero or
	// negative means unlimited.
	DeviceMemoryLimit int64
	HostMemoryLimit   int64
	// HostRegionBytes, when positive, treats each host-mapped allocation as
	// registered in regions of this many bytes from its base, as the CUDA
	// backend must. BatchCopy then splits a descriptor whose host-mapped side
	// crosses a region boundary, and counts the splits in Stats.RegionSplits.
	HostRegionBytes int64
	// SharedHostThread runs the host functions of every stream one at a
	// time, as CUDA may on its one driver thread: a host function that
	// blocks delays every other stream's host functions (not their other
	// work, nor a WaitHost).
	SharedHostThread bool
	// ResidentHostMemory faults host-mapped memory in at Alloc, as
	// cuMemHostRegister does for CUDA's pinned memory, so its first use costs
	// no page faults (benchmarks set it; tests leave it lazy, which is
	// cheaper for the many managers they make).
	ResidentHostMemory bool
}

// KindCounts is one counter per memory kind.
type KindCounts struct {
	Device, HostMapped int64
}

// Of returns the counter for kind k (0 for an unknown kind).
func (c KindCounts) Of(k device.MemoryKind) int64 {
	switch k {
	case device.DeviceMemory:
		return c.Device
	case device.HostMapped:
		return c.HostMapped
	}
	return 0
}

// Total returns the sum over all kinds.
func (c KindCounts) Total() int64 { return c.Device + c.HostMapped }

// Stats are the counters of a Device since New. Counters documented as
// counted at submission are exact as soon as the enqueuing call has returned;
// those counted at execution need a Synchronize first.
type Stats struct {
	// BatchCalls counts accepted, non-empty BatchCopy calls (at submission).
	BatchCalls int64
	// Descriptors counts accepted copy descriptors after region splitting
	// (at submission).
	Descriptors int64
	// RegionSplits counts the extra descriptors that region splitting added:
	// a descriptor cut into k pieces adds k-1 (at submission).
	RegionSplits int64
	// BytesCopied counts bytes actually copied (at execution; failed
	// descriptors copy nothing).
	BytesCopied int64
	// HostFuncs counts accepted HostFunc calls (at submission).
	HostFuncs int64
	// Allocs counts successful Alloc calls.
	Allocs KindCounts
	// LiveAllocs and LiveBytes describe allocations not yet freed.
	LiveAllocs KindCounts
	LiveBytes  KindCounts
}

// kindCounters is KindCounts with atomic fields, indexed by kind.
type kindCounters [2]atomic.Int64

func (c *kindCounters) load() KindCounts {
	return KindCounts{Device: c[device.DeviceMemory].Load(), HostMapped: c[device.HostMapped].Load()}
}

// nextHandle makes stream handles unique across devices, so a handle of one
// Device is never found by another's StreamFromHandle. Every handle the
// emulation makes carries madeTag in its top bits, which engine handles
// (small integers, or addresses) do not: AdoptStream never revives a closed
// stream's handle or takes another device's.
var nextHandle atomic.Uintptr

const (
	madeTag = uintptr(0xE) << 60
	tagMask = uintptr(0xF) << 60
)

// Device is the emulated device. It is safe for concurrent use.
type Device struct {
	opts Options

	// done is closed when Close starts; stream workers and the waits they
	// make watch it so that Close cancels queued work instead of draining it.
	done chan struct{}

	// mu guards closed, streams and nextOrdinal.
	mu          sync.Mutex
	closed      bool
	streams     map[uintptr]*stream
	nextOrdinal uint64
	workers     sync.WaitGroup

	// memMu guards the allocation registry. Stream workers hold it for
	// reading while they copy, so Free (which unmaps) waits for copies that
	// are running and later copies see the allocation gone.
	memMu  sync.RWMutex
	allocs []*allocation // live allocations, sorted by base address

	failNext atomic.Int64

	// hostThread serializes host functions under Options.SharedHostThread.
	hostThread sync.Mutex

	batchCalls, descriptors, regionSplits atomic.Int64
	bytesCopied, hostFuncs                atomic.Int64
	allocCount, liveAllocs, liveBytes     kindCounters
}

var _ device.Device = (*Device)(nil)

// New returns a Device configured by opts. Out-of-range options are clamped
// (see Options).
func New(opts Options) *Device {
	opts.MaxDelay = max(opts.MaxDelay, 0)
	opts.FailRate = min(max(opts.FailRate, 0), 1)
	opts.DeviceMemoryLimit = max(opts.DeviceMemoryLimit, 0)
	opts.HostMemoryLimit = max(opts.HostMemoryLimit, 0)
	opts.HostRegionBytes = max(opts.HostRegionBytes, 0)
	return &Device{
		opts:    opts,
		done:    make(chan struct{}),
		streams: make(map[uintptr]*stream),
	}
}

// Name returns "emu".
func (d *Device) Name() string { return "emu" }

// FailNext makes the next n copy descriptors submitted by BatchCopy on any
// stream of this device (counted after region splitting, in submission order)
// fail asynchronously with device.ErrInjected when they execute, instead of
// copying. Descriptors submitted before the call are not affected, so a test
// decides exactly which work fails regardless of timing. It replaces any count
// still pending; n <= 0 cancels it.
func (d *Device) FailNext(n int) {
	d.failNext.Store(int64(max(n, 0)))
}

// takeInjected consumes one pending FailNext failure, if any.
func (d *Device) takeInjected() bool {
	for {
		n := d.failNext.Load()
		if n <= 0 {
			return false
		}
		if d.failNext.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// Stats returns a snapshot of the counters. Counters are read one by one, so a
// snapshot taken while work runs may mix slightly different instants.
func (d *Device) Stats() Stats {
	return Stats{
		BatchCalls:   d.batchCalls.Load(),
		Descriptors:  d.descriptors.Load(),
		RegionSplits: d.regionSplits.Load(),
		BytesCopied:  d.bytesCopied.Load(),
		HostFuncs:    d.hostFuncs.Load(),
		Allocs:       d.allocCount.load(),
		LiveAllocs:   d.liveAllocs.load(),
		LiveBytes:    d.liveBytes.load(),
	}
}

// NewStream starts a stream and its worker goroutine.
func (d *Device) NewStream() (device.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("emu: new stream: %w", device.ErrClosed)
	}
	return d.startStream(nextHandle.Add(1) | madeTag), nil
}

// AdoptStream returns the emulated stream of an engine's handle: any value
// names a stream of its own, made on first use, so that a program passing
// its CUDA streams' handles runs unchanged on the emulation. A handle the
// emulation made (NewStream) is never adopted: when it is not open on this
// device, it is another device's or a closed stream's (ErrUnknownStream).
func (d *Device) AdoptStream(h uintptr) (device.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("emu: adopt stream %#x: %w", h, device.ErrClosed)
	}
	if s := d.streams[h]; s != nil {
		return s, nil
	}
	if h&tagMask == madeTag {
		return nil, fmt.Errorf("emu: adopt stream %#x: %w: a stream the emulation made, closed or another device's",
			h, device.ErrUnknownStream)
	}
	return d.startStream(h), nil
}

// startStream makes and starts the stream of handle h; mu is held.
func (d *Device) startStream(h uintptr) *stream {
	ordinal := d.nextOrdinal
	d.nextOrdinal++
	s := newStream(d, h, ordinal)
	d.streams[h] = s
	d.workers.Add(1)
	go func() {
		defer d.workers.Done()
		s.work()
	}()
	return s
}

// NewEvent returns an event that has never been recorded (complete, no
// failure).
func (d *Device) NewEvent() (device.Event, error) {
	if d.isClosed() {
		return nil, fmt.Errorf("emu: new event: %w", device.ErrClosed)
	}
	return &event{dev: d}, nil
}

// StreamFromHandle returns the open stream of this device whose Handle is h,
// or an error wrapping device.ErrUnknownStream (also for closed streams).
func (d *Device) StreamFromHandle(h uintptr) (device.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("emu: stream from handle %#x: %w", h, device.ErrClosed)
	}
	s, ok := d.streams[h]
	if !ok {
		return nil, fmt.Errorf("emu: stream from handle %#x: %w", h, device.ErrUnknownStream)
	}
	return s, nil
}

// Close cancels all queued work (copies and host functions not yet started are
// dropped; pending events and Synchronize calls complete with an error wrapping
// device.ErrClosed), waits for the operation each stream is running to finish,
// stops every stream goroutine and unmaps all memory. Every later operation on
// the device or anything it created fails with device.ErrClosed. A host
// function that never returns makes Close block forever.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("emu: close device: %w", device.ErrClosed)
	}
	d.closed = true
	close(d.done)
	streams := make([]*stream, 0, len(d.streams))
	for _, s := range d.streams {
		streams = append(streams, s)
	}
	clear(d.streams)
	d.mu.Unlock()

	for _, s := range streams {
		s.shut()
	}
	d.workers.Wait()
	return d.freeAll()
}

func (d *Device) isClosed() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}
