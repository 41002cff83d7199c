// Package convertnullable converts a struct parameter that may be NULL.
package convertnullable

import "github.com/kvcm/kvcm/gen/spec"

// Status is an error.
//
//kvcm:opaque
//kvcm:status
//kvcm:since 1
type Status struct{}

// Pair is a point.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go in image.Point
type Pair struct {
	// X is x.
	X int32
	// Y is y.
	Y int32
}

// F takes a pair.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param p borrowed,nullable,convert The pair.
type F func(p spec.In[Pair]) *Status
