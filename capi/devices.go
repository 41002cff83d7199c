package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
*/
import "C"

import (
	"slices"
	"sync"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/device/cuda"
)

// openDevice opens the device a configuration selects: KVCM_DEVICE_AUTO
// defers to backend.Open("") (the KVCM_DEVICE environment variable, else CUDA
// where there is a GPU, else the emulation).
func openDevice(kind C.kvcm_device_kind, ordinal C.int32_t) (device.Device, C.kvcm_device_kind, error) {
	var name string
	switch kind {
	case C.KVCM_DEVICE_AUTO:
	case C.KVCM_DEVICE_EMU:
		name = backend.Emu
	case C.KVCM_DEVICE_CUDA:
		name = backend.CUDA
	default:
		return nil, 0, argError("config.device", "unknown device kind %d", int32(kind))
	}
	if ordinal < 0 {
		return nil, 0, argError("config.device_ordinal", "must not be negative, got %d", int32(ordinal))
	}
	d, err := backend.OpenWith(name, backend.Options{CUDA: cuda.Options{Ordinal: int(ordinal)}})
	if err != nil {
		return nil, 0, err
	}
	got := C.kvcm_device_kind(C.KVCM_DEVICE_EMU)
	if d.Name() != backend.Emu {
		got = C.KVCM_DEVICE_CUDA
	}
	return d, got, nil
}

// The devices of live managers, in creation order, so that a native stream
// handle given to a kvcm_stream_* function (by a codec, say) resolves to its
// device.Stream, with the memory codecs allocated through their streams.
// Emulated stream handles are unique per process.
var devices struct {
	mu   sync.Mutex
	list []*devEntry
}

type devEntry struct {
	dev device.Device
	mem map[device.Ptr]device.Memory // from kvcm_stream_alloc_memory
}

func registerDevice(d device.Device) {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	devices.list = append(devices.list, &devEntry{dev: d, mem: map[device.Ptr]device.Memory{}})
}

// unregisterDevice forgets a device and frees what codecs allocated on it.
func unregisterDevice(d device.Device) {
	devices.mu.Lock()
	var e *devEntry
	if i := slices.IndexFunc(devices.list, func(x *devEntry) bool { return x.dev == d }); i >= 0 {
		e = devices.list[i]
		devices.list = slices.Delete(devices.list, i, i+1)
	}
	devices.mu.Unlock()
	if e != nil {
		for _, m := range e.mem {
			m.Free()
		}
	}
}

// resolveStreamEntry finds the stream of a native handle on a live
// manager's device.
func resolveStreamEntry(h C.kvcm_stream) (device.Stream, *devEntry, error) {
	if h == 0 {
		return nil, nil, argError("stream", "is 0")
	}
	devices.mu.Lock()
	list := slices.Clone(devices.list)
	devices.mu.Unlock()
	for _, e := range list {
		if s, err := e.dev.StreamFromHandle(uintptr(h)); err == nil {
			return s, e, nil
		}
	}
	return nil, nil, argError("stream", "%#x is not a live stream of any manager's device", uintptr(h))
}

func resolveStream(h C.kvcm_stream) (device.Stream, error) {
	s, _, err := resolveStreamEntry(h)
	return s, err
}

func glueStreamAllocMemory(stream C.kvcm_stream, kind C.kvcm_memory_kind, size C.uint64_t, out *C.kvcm_device_ptr) error {
	_, e, err := resolveStreamEntry(stream)
	if err != nil {
		return err
	}
	k, err := memoryKind(kind, size)
	if err != nil {
		return err
	}
	mem, err := e.dev.Alloc(k, int64(size))
	if err != nil {
		return err
	}
	devices.mu.Lock()
	e.mem[mem.Ptr()] = mem
	devices.mu.Unlock()
	*out = C.kvcm_device_ptr(mem.Ptr())
	return nil
}

func glueStreamFreeMemory(stream C.kvcm_stream, ptr C.kvcm_device_ptr) error {
	_, e, err := resolveStreamEntry(stream)
	if err != nil {
		return err
	}
	devices.mu.Lock()
	mem, ok := e.mem[device.Ptr(ptr)]
	delete(e.mem, device.Ptr(ptr))
	devices.mu.Unlock()
	if !ok {
		return argError("ptr", "%#x was not allocated on this stream's device with kvcm_stream_alloc_memory, or was already freed", uint64(ptr))
	}
	return mem.Free()
}
