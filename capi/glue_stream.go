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

	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/device"
)

// resolveStream finds the stream of a native handle on a live manager's
// device.
func resolveStream(h C.kvcm_stream) (device.Stream, error) {
	return abimodel.Devices.Stream(uintptr(h))
}

// HostFuncError is the asynchronous failure of a host function that returned
// nonzero.
type HostFuncError struct{ Code int32 }

func (e *HostFuncError) Error() string { return fmt.Sprintf("host function returned %d", e.Code) }

func glueStreamEnqueueHostFunc(stream C.kvcm_stream, fn C.kvcm_host_func, user C.uintptr_t) error {
	return abimodel.Devices.HostFunc(uintptr(stream), func() error {
		if r := C.kvcm__call_host_func(fn, user); r != 0 {
			return &HostFuncError{Code: int32(r)}
		}
		return nil
	})
}

func glueStreamCopyFromHost(stream C.kvcm_stream, dst C.kvcm_device_ptr, src C.uintptr_t, size C.size_t) error {
	if size > abimodel.MaxElems {
		return argError("size", "%d is too large", uint64(size))
	}
	var b []byte
	if size > 0 {
		b = unsafe.Slice((*byte)(C.kvcm__ptr(src)), int(size))
	}
	return abimodel.Devices.CopyFromHost(uintptr(stream), device.Ptr(dst), b)
}
