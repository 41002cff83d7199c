// Package cppimplbool asks for C++ trampolines of a slot that returns bool.
package cppimplbool

import "github.com/kvcm/kvcm/gen/spec"

// V is a vtable.
//
//kvcm:vtable
//kvcm:versioned
//kvcm:cppimpl
//kvcm:since 1
type V struct {
	// Ok answers.
	Ok func(self spec.VoidPtr) bool
}
