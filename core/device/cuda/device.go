//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/kernels"
)

// Device is one CUDA GPU behind device.Device. It is safe for concurrent use,
// except that Close must not run concurrently with other calls.
type Device struct {
	opts  Options
	props Properties
	cuDev C.kv_CUdevice
	ctx   C.kv_CUcontext
	mode  C.int

	closed atomic.Bool

	// memMu guards the allocation registry. BatchCopy and CopyFromHost hold
	// it for reading while they validate and submit, Alloc and Free for
	// writing.
	memMu  sync.RWMutex
	allocs []*allocation // live, sorted by base
	region int64

	// mu guards the object sets, for StreamFromHandle and Close.
	mu      sync.Mutex
	streams map[uintptr]*Stream
	events  map[*Event]struct{}
	modules map[*Module]struct{}

	uploadOnce sync.Once
	upload     *Function
	uploadErr  error

	granOnce sync.Once
	gran     int64
	granErr  error

	// priv is a private stream for the device's own synchronous work
	// (zeroing grown memory, probing WaitHost), created on first use; words
	// are WaitHost's host words. privMu guards both.
	privMu sync.Mutex
	priv   C.kv_CUstream
	words  hostWords
}

var _ device.Device = (*Device)(nil)

// Available reports whether the CUDA driver loads and sees at least one GPU.
// It costs a driver initialization the first time.
func Available() bool {
	if loadDriver(DefaultLibrary) != nil {
		return false
	}
	var n C.int
	return C.kv_device_count(&n) == C.KV_CUDA_SUCCESS && n > 0
}

// OpenDevice is New returning the device.Device interface.
func OpenDevice(opts Options) (device.Device, error) {
	d, err := New(opts)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// New opens GPU opts.Ordinal: it loads the driver (once per process),
// retains the device's primary context and reads its properties. Where there
// is no driver or no suitable GPU it returns an error wrapping ErrUnavailable.
func New(opts Options) (*Device, error) {
	region := opts.HostRegionBytes
	if region == 0 {
		region = MaxHostRegionBytes
	}
	if region < 0 || region > MaxHostRegionBytes || region%int64(os.Getpagesize()) != 0 {
		return nil, fmt.Errorf("cuda: HostRegionBytes %d must be a positive multiple of the page size %d, at most %d",
			opts.HostRegionBytes, os.Getpagesize(), MaxHostRegionBytes)
	}
	if err := loadDriver(opts.LibraryPath); err != nil {
		return nil, err
	}
	var count C.int
	if err := check("cuDeviceGetCount", C.kv_device_count(&count)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if count == 0 {
		return nil, fmt.Errorf("%w: the driver sees no CUDA device", ErrUnavailable)
	}
	if opts.Ordinal < 0 || opts.Ordinal >= int(count) {
		return nil, fmt.Errorf("%w: device ordinal %d outside [0, %d)", ErrUnavailable, opts.Ordinal, int(count))
	}
	d := &Device{
		opts:    opts,
		region:  region,
		streams: make(map[uintptr]*Stream),
		events:  make(map[*Event]struct{}),
		modules: make(map[*Module]struct{}),
	}
	if err := check("cuDeviceGet", C.kv_device_get(&d.cuDev, C.int(opts.Ordinal))); err != nil {
		return nil, err
	}
	if err := d.readProperties(); err != nil {
		return nil, err
	}
	if err := check("cuDevicePrimaryCtxRetain", C.kv_primary_retain(d.cuDev, &d.ctx)); err != nil {
		return nil, err
	}
	d.mode = C.kv_batch_mode()
	if opts.ForceLegacyCopies {
		d.mode = C.KV_BATCH_LEGACY
	}
	d.props.BatchMode = BatchMode(d.mode)
	return d, nil
}

func (d *Device) readProperties() error {
	p := &d.props
	p.Ordinal = d.opts.Ordinal
	p.DriverVersion = int(C.kv_driver_version())
	p.HostRegionBytes = d.region
	var name [256]C.char
	if err := check("cuDeviceGetName", C.kv_device_name(d.cuDev, &name[0], C.int(len(name)))); err != nil {
		return err
	}
	p.Name = C.GoString(&name[0])
	attr := func(a C.int) (int, error) {
		var v C.int
		err := checkf(C.kv_device_attr(d.cuDev, a, &v), "cuDeviceGetAttribute(%d)", int(a))
		return int(v), err
	}
	var errs []error
	var uva, canMap int
	for _, x := range []struct {
		a   C.int
		dst *int
	}{
		{C.KV_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &p.ComputeMajor},
		{C.KV_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &p.ComputeMinor},
		{C.KV_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &p.Multiprocessors},
		{C.KV_CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, &p.MaxThreadsPerMultiprocessor},
		{C.KV_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, &uva},
		{C.KV_CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, &canMap},
	} {
		v, err := attr(x.a)
		errs = append(errs, err)
		*x.dst = v
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var total C.size_t
	if err := check("cuDeviceTotalMem", C.kv_device_total_mem(d.cuDev, &total)); err != nil {
		return err
	}
	p.TotalMemory = int64(total)
	if uva == 0 || canMap == 0 {
		return fmt.Errorf("%w: %s lacks unified addressing or host-memory mapping, which host-mapped memory needs",
			ErrUnavailable, p.Name)
	}
	return nil
}

// Name returns "cuda".
func (d *Device) Name() string { return "cuda" }

// Properties describes the GPU and how the device submits copies.
func (d *Device) Properties() Properties { return d.props }

// MemInfo returns the free and total device memory (cuMemGetInfo).
func (d *Device) MemInfo() (free, total int64, err error) {
	if d.closed.Load() {
		return 0, 0, fmt.Errorf("cuda: mem info: %w", device.ErrClosed)
	}
	var f, t C.size_t
	err = check("cuMemGetInfo", C.kv_mem_get_info(d.ctx, &f, &t))
	return int64(f), int64(t), err
}

// Synchronize waits for all work of the device's context (cuCtxSynchronize).
func (d *Device) Synchronize() error {
	if d.closed.Load() {
		return fmt.Errorf("cuda: synchronize: %w", device.ErrClosed)
	}
	return check("cuCtxSynchronize", C.kv_ctx_sync(d.ctx))
}

// NewStream creates a non-blocking stream.
func (d *Device) NewStream() (device.Stream, error) { return d.newStream() }

func (d *Device) newStream() (*Stream, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda: new stream: %w", device.ErrClosed)
	}
	s := &Stream{dev: d, ev: &interval{}, sync: &interval{}}
	if err := check("cuStreamCreate", C.kv_stream_create(d.ctx, &s.h)); err != nil {
		return nil, err
	}
	s.handle = handleOf(s.h)
	d.mu.Lock()
	d.streams[s.handle] = s
	d.mu.Unlock()
	return s, nil
}

// NewEvent creates an event without timing (CU_EVENT_DISABLE_TIMING).
func (d *Device) NewEvent() (device.Event, error) { return d.newEvent(false) }

// NewTimingEvent creates an event that records timestamps, for ElapsedTime.
func (d *Device) NewTimingEvent() (*Event, error) { return d.newEvent(true) }

func (d *Device) newEvent(timing bool) (*Event, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda: new event: %w", device.ErrClosed)
	}
	e := &Event{dev: d, timing: timing}
	t := C.int(0)
	if timing {
		t = 1
	}
	if err := check("cuEventCreate", C.kv_event_create(d.ctx, &e.h, t)); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.events[e] = struct{}{}
	d.mu.Unlock()
	return e, nil
}

// AdoptStream returns a Stream over the engine's CUstream h (0: the legacy
// default stream) after checking that it belongs to the device's context
// (an error wrapping device.ErrUnknownStream otherwise). The device never
// destroys it: the engine keeps it alive while the device uses it.
func (d *Device) AdoptStream(h uintptr) (device.Stream, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda: adopt stream %#x: %w", h, device.ErrClosed)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.streams[h]; ok {
		return s, nil
	}
	var same C.int
	if err := check("cuStreamGetCtx", C.kv_stream_check_ctx(d.ctx, C.uintptr_t(h), &same)); err != nil {
		return nil, fmt.Errorf("cuda: adopt stream %#x: %w (%w)", h, device.ErrUnknownStream, err)
	}
	if same == 0 {
		return nil, fmt.Errorf("cuda: adopt stream %#x: %w: it belongs to another context", h, device.ErrUnknownStream)
	}
	s := &Stream{dev: d, h: C.kv_stream_of(C.uintptr_t(h)), handle: h, borrowed: true, ev: &interval{}, sync: &interval{}}
	d.streams[h] = s
	return s, nil
}

// StreamFromHandle returns the open stream of this device whose Handle is h
// (its CUstream), or an error wrapping device.ErrUnknownStream.
func (d *Device) StreamFromHandle(h uintptr) (device.Stream, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda: stream from handle %#x: %w", h, device.ErrClosed)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.streams[h]
	if !ok {
		return nil, fmt.Errorf("cuda: stream from handle %#x: %w", h, device.ErrUnknownStream)
	}
	return s, nil
}

// Close waits for all work of the context (CUDA cannot cancel queued work, so
// unlike emu it drains), destroys every stream, event and module the device
// created, frees every allocation and releases the primary context. Later
// operations fail with device.ErrClosed; closing twice too.
func (d *Device) Close() error {
	if !d.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda: close device: %w", device.ErrClosed)
	}
	var errs []error
	errs = append(errs, check("cuCtxSynchronize (close)", C.kv_ctx_sync(d.ctx)))
	d.mu.Lock()
	streams, events, modules := d.streams, d.events, d.modules
	d.streams, d.events, d.modules = map[uintptr]*Stream{}, map[*Event]struct{}{}, map[*Module]struct{}{}
	d.mu.Unlock()
	for _, s := range streams {
		errs = append(errs, s.destroy())
	}
	for e := range events {
		errs = append(errs, e.destroy())
	}
	for m := range modules {
		errs = append(errs, m.unload())
	}
	errs = append(errs, d.freeAll())
	d.privMu.Lock()
	if d.priv != nil {
		errs = append(errs, check("cuStreamDestroy (private)", C.kv_stream_destroy(d.ctx, d.priv)))
		d.priv = nil
	}
	errs = append(errs, d.releaseWords())
	d.privMu.Unlock()
	errs = append(errs, check("cuDevicePrimaryCtxRelease", C.kv_primary_release(d.cuDev)))
	return errors.Join(errs...)
}

// uploadFunction loads kernels/upload.ptx once, for CopyFromHost before 12.8.
func (d *Device) uploadFunction() (*Function, error) {
	d.uploadOnce.Do(func() {
		ptx, err := kernels.PTX(kernels.Upload)
		if err != nil {
			d.uploadErr = err
			return
		}
		m, err := d.LoadModule(ptx)
		if err != nil {
			d.uploadErr = fmt.Errorf("cuda: loading the index upload kernel: %w", err)
			return
		}
		d.upload, d.uploadErr = m.Function("kvcm_upload_segment")
	})
	return d.upload, d.uploadErr
}
