package abimodel

import (
	"slices"
	"sync"

	"github.com/kvcm/kvcm/core/device"
)

// A DeviceRegistry lists the devices of live managers, in creation order,
// so that a native stream handle (the kvcm_stream a codec is given, say)
// resolves to its device.Stream, and memory a codec allocates through a
// stream is owned by that stream's device and freed with the manager. It is
// safe for concurrent use.
type DeviceRegistry struct {
	mu   sync.Mutex
	list []*deviceEntry
}

// Devices is the process-wide registry; the C ABI uses it.
var Devices = &DeviceRegistry{}

type deviceEntry struct {
	dev device.Device
	mem map[device.Ptr]device.Memory // allocated through Alloc
}

// Register adds a device.
func (r *DeviceRegistry) Register(d device.Device) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, &deviceEntry{dev: d, mem: map[device.Ptr]device.Memory{}})
}

// Unregister forgets a device and frees the memory allocated on it through
// Alloc.
func (r *DeviceRegistry) Unregister(d device.Device) {
	r.mu.Lock()
	var e *deviceEntry
	if i := slices.IndexFunc(r.list, func(x *deviceEntry) bool { return x.dev == d }); i >= 0 {
		e = r.list[i]
		r.list = slices.Delete(r.list, i, i+1)
	}
	r.mu.Unlock()
	if e != nil {
		for _, m := range e.mem {
			m.Free()
		}
	}
}

func (r *DeviceRegistry) entry(h uintptr) (device.Stream, *deviceEntry, error) {
	if h == 0 {
		return nil, nil, argErr("stream", "is 0")
	}
	r.mu.Lock()
	list := slices.Clone(r.list)
	r.mu.Unlock()
	for _, e := range list {
		if s, err := e.dev.StreamFromHandle(h); err == nil {
			return s, e, nil
		}
	}
	return nil, nil, argErr("stream", "%#x is not a live stream of any manager's device", h)
}

// Stream resolves a native stream handle on a registered device.
func (r *DeviceRegistry) Stream(h uintptr) (device.Stream, error) {
	s, _, err := r.entry(h)
	return s, err
}

// Alloc allocates size bytes of kind on the device that owns stream h. The
// memory lives until Free or until the device is unregistered.
func (r *DeviceRegistry) Alloc(h uintptr, kind device.MemoryKind, size uint64) (device.Ptr, error) {
	_, e, err := r.entry(h)
	if err != nil {
		return 0, err
	}
	mem, err := allocMemory(e.dev, kind, size)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	e.mem[mem.Ptr()] = mem
	r.mu.Unlock()
	return mem.Ptr(), nil
}

// Free frees memory Alloc allocated on the device of stream h.
func (r *DeviceRegistry) Free(h uintptr, ptr device.Ptr) error {
	_, e, err := r.entry(h)
	if err != nil {
		return err
	}
	r.mu.Lock()
	mem, ok := e.mem[ptr]
	delete(e.mem, ptr)
	r.mu.Unlock()
	if !ok {
		return argErr("ptr", "%#x was not allocated on this stream's device with kvcm_stream_alloc_memory, or was already freed", uint64(ptr))
	}
	return mem.Free()
}

// allocMemory checks the kind and the size, and allocates.
func allocMemory(d device.Device, kind device.MemoryKind, size uint64) (device.Memory, error) {
	switch kind {
	case device.DeviceMemory, device.HostMapped:
	default:
		return nil, argErr("kind", "unknown memory kind %d", int(kind))
	}
	if size == 0 || size > MaxElems {
		return nil, argErr("size", "must be in [1, 2^40], got %d", size)
	}
	return d.Alloc(kind, int64(size))
}
