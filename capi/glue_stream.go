package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/kvcm/kvcm/core/device"
)

func glueManagerCreateStream(mgr *managerObj, out *C.kvcm_stream) error {
	mgr.mu.Lock()
	defer mgr.mu.Unlock()
	if mgr.gone {
		return errorf(codeInvalidHandle, "manager is being destroyed")
	}
	s, err := mgr.dev.NewStream()
	if err != nil {
		return err
	}
	mgr.streams[s.Handle()] = s
	*out = C.kvcm_stream(s.Handle())
	return nil
}

func glueManagerDestroyStream(mgr *managerObj, stream C.kvcm_stream) error {
	mgr.mu.Lock()
	s, ok := mgr.streams[uintptr(stream)]
	delete(mgr.streams, uintptr(stream))
	mgr.mu.Unlock()
	if !ok {
		return argError("stream", "%#x was not created by this manager or was already destroyed", uintptr(stream))
	}
	err := s.Synchronize()
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	return err
}

func glueManagerAllocMemory(mgr *managerObj, kind C.kvcm_memory_kind, size C.uint64_t, out *C.kvcm_device_ptr) error {
	k, err := memoryKind(kind, size)
	if err != nil {
		return err
	}
	mgr.mu.Lock()
	defer mgr.mu.Unlock()
	if mgr.gone {
		return errorf(codeInvalidHandle, "manager is being destroyed")
	}
	mem, err := mgr.dev.Alloc(k, int64(size))
	if err != nil {
		return err
	}
	mgr.mem[mem.Ptr()] = mem
	*out = C.kvcm_device_ptr(mem.Ptr())
	return nil
}

func memoryKind(kind C.kvcm_memory_kind, size C.uint64_t) (device.MemoryKind, error) {
	if size == 0 || size > maxElems {
		return 0, argError("size", "must be in [1, 2^40], got %d", uint64(size))
	}
	switch kind {
	case C.KVCM_MEMORY_DEVICE:
		return device.DeviceMemory, nil
	case C.KVCM_MEMORY_HOST_MAPPED:
		return device.HostMapped, nil
	}
	return 0, argError("kind", "unknown memory kind %d", int32(kind))
}

func glueManagerFreeMemory(mgr *managerObj, ptr C.kvcm_device_ptr) error {
	mgr.mu.Lock()
	mem, ok := mgr.mem[device.Ptr(ptr)]
	delete(mgr.mem, device.Ptr(ptr))
	mgr.mu.Unlock()
	if !ok {
		return argError("ptr", "%#x was not allocated by this manager or was already freed", uint64(ptr))
	}
	return mem.Free()
}

func glueStreamSynchronize(stream C.kvcm_stream) error {
	s, err := resolveStream(stream)
	if err != nil {
		return err
	}
	return s.Synchronize()
}

// HostFuncError is the asynchronous failure of a host function that returned
// nonzero.
type HostFuncError struct{ Code int32 }

func (e *HostFuncError) Error() string { return fmt.Sprintf("host function returned %d", e.Code) }

func glueStreamEnqueueHostFunc(stream C.kvcm_stream, fn C.kvcm_host_func, user C.uintptr_t) error {
	s, err := resolveStream(stream)
	if err != nil {
		return err
	}
	return s.HostFunc(func() error {
		if r := C.kvcm__call_host_func(fn, user); r != 0 {
			return &HostFuncError{Code: int32(r)}
		}
		return nil
	})
}

func glueStreamBatchCopy(stream C.kvcm_stream, descs *C.kvcm__const_kvcm_copy_desc, n C.size_t) error {
	s, err := resolveStream(stream)
	if err != nil {
		return err
	}
	cd, err := cArray(descs, n, "descs")
	if err != nil {
		return err
	}
	out := make([]device.CopyDesc, len(cd))
	for i, d := range cd {
		if uint64(d.size) > maxElems {
			return argError(fmt.Sprintf("descs[%d].size", i), "%d is too large", uint64(d.size))
		}
		out[i] = device.CopyDesc{Dst: device.Ptr(d.dst), Src: device.Ptr(d.src), Size: int64(d.size)}
	}
	return s.BatchCopy(out)
}

func glueStreamCopyFromHost(stream C.kvcm_stream, dst C.kvcm_device_ptr, src C.uintptr_t, size C.size_t) error {
	s, err := resolveStream(stream)
	if err != nil {
		return err
	}
	if size > maxElems {
		return argError("size", "%d is too large", uint64(size))
	}
	if size == 0 {
		return nil
	}
	return s.CopyFromHost(device.Ptr(dst), unsafe.Slice((*byte)(C.kvcm__ptr(src)), int(size)))
}
