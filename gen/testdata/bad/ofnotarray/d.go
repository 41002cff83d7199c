// Package ofnotarray names a field that is not an array as a nested buffer's.
package ofnotarray

import "github.com/kvcm/kvcm/gen/spec"

// Status is an error.
//
//kvcm:opaque
//kvcm:status
//kvcm:since 1
type Status struct{}

// Pair is a pair.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go out image.Point
type Pair struct {
	// X is first.
	X int32
	// Y is second.
	Y int32
}

// F writes pairs.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param pairs out,nullable,len=capacity,buffer=needed Receives pairs.
//kvcm:param capacity in Capacity of pairs.
//kvcm:param xs out,nullable,len=xsCap,of=pairs.x Receives the xs.
//kvcm:param xsCap in Capacity of xs.
//kvcm:param needed out Receives the count.
type F func(pairs spec.Out[Pair], capacity spec.Size, xs spec.Out[int32], xsCap spec.Size, needed spec.Out[spec.Size]) *Status
