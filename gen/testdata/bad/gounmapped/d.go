// Package gounmapped maps a struct to a Go struct that lacks one of its
// fields, without go:"-".
package gounmapped

// P is a point with a depth image.Point has not.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go inout image.Point
type P struct {
	// X is x.
	X int32
	// Y is y.
	Y int32
	// Z is z.
	Z int32
}
