// Package resetnobuffer marks a parameter reset that is not a buffer.
package resetnobuffer

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
//kvcm:param values borrowed,nullable,len=numValues,slice,go=int,reset The values.
//kvcm:param numValues in The number of values.
type F func(values spec.In[int32], numValues spec.Size) *Status
