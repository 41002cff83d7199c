// Package takenonested takes into a buffer without a nested buffer.
package takenonested

import "github.com/kvcm/kvcm/gen/spec"

// Status is an error.
//
//kvcm:opaque
//kvcm:status
//kvcm:since 1
type Status struct{}

// F takes values.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param xs out,nullable,len=capacity,buffer=needed,take,go=int Receives the xs.
//kvcm:param capacity in Capacity.
//kvcm:param needed out Receives the count.
type F func(xs spec.Out[int64], capacity spec.Size, needed spec.Out[spec.Size]) *Status
