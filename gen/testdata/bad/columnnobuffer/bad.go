// Package columnnobuffer names as the buffer of a column a parameter that
// is no buffer.
package columnnobuffer

import "github.com/kvcm/kvcm/gen/spec"

// Status is an error.
//
//kvcm:opaque
//kvcm:status
//kvcm:since 1
type Status struct{}

// F writes columns.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param xs out,nullable,len=capacity Receives the xs.
//kvcm:param ys out,nullable,len=capacity,column=xs.Y Receives the ys.
//kvcm:param capacity in Capacity.
type F func(xs spec.Out[int64], ys spec.Out[int64], capacity spec.Size) *Status
