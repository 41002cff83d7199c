//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

var loadMu sync.Mutex

// loadDriver opens and initializes the driver once per process.
func loadDriver(path string) error {
	if path == "" {
		path = DefaultLibrary
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	r := C.kv_load(cpath, &buf[0], C.size_t(len(buf)))
	if r == 0 {
		return nil
	}
	msg := C.GoString(&buf[0])
	if r < 0 {
		return fmt.Errorf("%w: %s", ErrUnavailable, msg)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, newError(msg, C.kv_CUresult(r)))
}

// newError converts a failed CUresult into an *Error.
func newError(op string, r C.kv_CUresult) *Error {
	e := &Error{Op: op, Result: int(r)}
	if s := C.kv_error_name(r); s != nil {
		e.Name = C.GoString(s)
	} else {
		e.Name = fmt.Sprintf("CUresult(%d)", int(r))
	}
	if s := C.kv_error_string(r); s != nil {
		e.Description = C.GoString(s)
	}
	return e
}

// check returns nil for CUDA_SUCCESS and an *Error otherwise.
func check(op string, r C.kv_CUresult) error {
	if r == C.KV_CUDA_SUCCESS {
		return nil
	}
	return newError(op, r)
}

// checkf is check with a formatted op, built only on failure.
func checkf(r C.kv_CUresult, format string, args ...any) error {
	if r == C.KV_CUDA_SUCCESS {
		return nil
	}
	return newError(fmt.Sprintf(format, args...), r)
}
