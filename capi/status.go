package capi

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/debug"
	"unsafe"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
)

// Error is an error with an explicit status code, for failures the glue
// detects itself.
type Error struct {
	Code C.kvcm_status_code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func errorf(code C.kvcm_status_code, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// argError is an INVALID_ARGUMENT error naming the argument.
func argError(arg, format string, args ...any) error {
	return &Error{Code: codeInvalidArgument, Msg: arg + ": " + fmt.Sprintf(format, args...)}
}

// codeOf maps an error to its status code: core's sentinels first, then
// device errors. An error carrying its cause maps to its outcome: an
// out-of-pages error whose victims failed to encode is OUT_OF_PAGES.
func codeOf(err error) C.kvcm_status_code {
	var e *Error
	var hf *HostFuncError
	switch {
	case errors.As(err, &e):
		return e.Code
	case errors.As(err, &hf):
		return codeDevice
	case errors.Is(err, cuda.ErrUnavailable):
		return codeUnsupported
	case errors.Is(err, core.ErrInvalidConfig):
		return codeInvalidConfig
	case errors.Is(err, core.ErrCodecRejected), errors.Is(err, codec.ErrQuery):
		return codeCodecRejected
	case errors.Is(err, core.ErrInvalidArgument):
		return codeInvalidArgument
	case errors.Is(err, core.ErrInvalidState), errors.Is(err, core.ErrDiskInUse):
		return codeInvalidState
	case errors.Is(err, core.ErrOutOfPages):
		return codeOutOfPages
	case errors.Is(err, core.ErrResumeRefused):
		return codeResumeRefused
	case errors.Is(err, core.ErrDataLost):
		return codeDataLost
	case errors.Is(err, core.ErrCodecFailed):
		return codeCodecFailed
	case errors.Is(err, core.ErrIO):
		return codeIO
	case errors.Is(err, core.ErrClosed):
		return codeClosed
	case errors.Is(err, codec.ErrConsumed), errors.Is(err, abimodel.ErrDestroyed):
		return codeInvalidHandle
	case errors.Is(err, device.ErrOutOfMemory), errors.Is(err, device.ErrInvalidCopy),
		errors.Is(err, device.ErrClosed), errors.Is(err, device.ErrInjected),
		errors.Is(err, device.ErrUnknownStream):
		return codeDevice
	}
	return codeInternal
}

// newStatus allocates a status in C memory.
func newStatus(code C.kvcm_status_code, msg string) *C.kvcm_status {
	var p *C.char
	if len(msg) > 0 {
		p = (*C.char)(unsafe.Pointer(unsafe.StringData(msg)))
	}
	s := C.kvcm__status_new(code, p, C.size_t(len(msg)))
	if s == nil {
		return &C.kvcm__status_oom
	}
	return s
}

// statusOf turns the glue's error into a status (nil for success).
func statusOf(fn string, err error) *C.kvcm_status {
	if err == nil {
		return nil
	}
	return newStatus(codeOf(err), fn+": "+err.Error())
}

// argStatus reports an invalid argument by name.
func argStatus(fn, arg, msg string) *C.kvcm_status {
	return newStatus(codeInvalidArgument, fn+": "+arg+": "+msg)
}

// checkVersion validates the struct_size and abi_version of a versioned
// struct the caller passed.
func checkVersion(fn, arg string, size, version, minSize uint32) *C.kvcm_status {
	if version == 0 {
		return argStatus(fn, arg+".abi_version", "is 0: initialize the struct with its _INIT macro (abi_version = KVCM_ABI_VERSION)")
	}
	if size < minSize {
		return argStatus(fn, arg+".struct_size", fmt.Sprintf("is %d, less than the %d bytes of ABI version 1: set it to sizeof the struct", size, minSize))
	}
	return nil
}

func isPoisoned() bool { return abimodel.LibraryPoison.Poisoned() }

func poisonedStatus(fn string) *C.kvcm_status {
	return newStatus(codePoisoned, fn+": library poisoned by an earlier panic ("+abimodel.LibraryPoison.Reason()+"); restart the process")
}

// poison records a panic and poisons the library.
func poison(fn string, r any) string {
	msg := fmt.Sprintf("%s: panic: %v", fn, r)
	if abimodel.LibraryPoison.Set(msg) && debugStacks {
		fmt.Printf("%s\n%s", msg, debug.Stack())
	}
	return msg
}

// panicStatus poisons the library and reports the panic as INTERNAL.
func panicStatus(fn string, r any) *C.kvcm_status {
	return newStatus(codeInternal, poison(fn, r))
}

// discardStatus frees a status a value-returning export cannot report.
func discardStatus(s *C.kvcm_status) { C.kvcm_status_free(s) }

// debugStacks prints the stack of the poisoning panic (KVCM_DEBUG_STACKS=1).
var debugStacks = envIs("KVCM_DEBUG_STACKS", "1")
