// Package gocallerstructcount gives a Go caller's struct array a Go type
// other than a slice of the struct's //kvcm:go type.
package gocallerstructcount

import "github.com/kvcm/kvcm/gen/spec"

// Pt is a point.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go inout image.Point
type Pt struct {
	// X is x.
	X int32
	// Y is y.
	Y int32
}

// Vt is called from Go.
//
//kvcm:vtable
//kvcm:versioned
//kvcm:since 1
//kvcm:gocaller github.com/kvcm/kvcm/core/abimodel.ExternalCodec
type Vt struct {
	// Configure takes points, which ExternalCodec.Configure does not.
	Configure func(self spec.VoidPtr, pts spec.In[Pt], n spec.Size) bool
}
