// Package goimplmethod has a Go-implemented vtable whose Go type's method
// does not fit its slot.
package goimplmethod

import "github.com/kvcm/kvcm/gen/spec"

// V is a vtable.
//
//kvcm:vtable
//kvcm:goimpl builtin github.com/kvcm/kvcm/gen/testdata/tinygo.Plugin
//kvcm:since 1
type V struct {
	// Probe returns a failure code, which Plugin.Probe's error is; n has no
	// counterpart there.
	Probe func(self spec.VoidPtr, n int32) int32
}
