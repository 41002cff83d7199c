// Package abimodel is the object model of kvcm's C ABI in plain Go: what a
// kvcm_manager, kvcm_kv_cache, kvcm_cp_index and kvcm_stream are, and every
// rule they follow, as C, C++ and Python users see them. package capi only
// converts C values to the Go values of this package and back, maps errors to
// status codes and keeps the handle table; everything else the C ABI does is
// here, tested without cgo.
//
// A Manager wraps a core.Manager and owns what a C user gets from it besides
// caches: the streams and memory it allocates on its device, the bounded
// queue of cache events with its drop count, the CP index it attaches to new
// caches, and its entry in a DeviceRegistry (so that a native stream handle
// given to a codec resolves to its device). Closing a Manager closes its open
// caches first, exactly as core.Manager.Close does: there is one rule for
// every language.
//
// The package lives under core/ because it is behaviour, and is not
// internal because capi (outside core/) builds on it. Go programs normally
// use package core directly; they use this package when they want the
// ABI's semantics, for example a manager that owns its streams and queues
// its events.
//
// Errors wrap core's sentinels (core.ErrInvalidArgument, core.ErrInvalidState,
// ...) or ErrDestroyed, which the C ABI reports as KVCM_ERR_INVALID_HANDLE.
package abimodel

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core"
)

// ErrDestroyed: the object was destroyed (or is being destroyed), so the
// call cannot use it. The C ABI reports it as KVCM_ERR_INVALID_HANDLE.
var ErrDestroyed = errors.New("destroyed")

// MaxElems bounds every count and size taken from a caller (2^40), so that a
// garbage value is an argument error rather than a huge allocation.
const MaxElems = 1 << 40

// MaxInputBytes bounds the bytes of one input array or string a caller
// passes (1 GiB). The library copies its inputs, and Go's runtime aborts the
// process, rather than panic, when it cannot map an allocation: a garbage
// count (a prompt of 2^33 tokens) must be an argument error before the
// copy.
const MaxInputBytes = 1 << 30

func argErr(arg, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", core.ErrInvalidArgument, arg, fmt.Sprintf(format, args...))
}

func destroyedErr(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrDestroyed)
}
