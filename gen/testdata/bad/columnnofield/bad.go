// Package columnnofield names a column that its buffer's Go struct lacks.
package columnnofield

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
//kvcm:param xs out,nullable,len=capacity,buffer=needed,go=image.Point,column=X Receives the xs.
//kvcm:param zs out,nullable,len=capacity,column=xs.Z Receives the zs.
//kvcm:param capacity in Capacity.
//kvcm:param needed out Receives the count.
type F func(xs spec.Out[int64], zs spec.Out[int64], capacity spec.Size, needed spec.Out[spec.Size]) *Status
