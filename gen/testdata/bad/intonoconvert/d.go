// Package intonoconvert sets a field of a parameter that is not converted.
package intonoconvert

import "github.com/kvcm/kvcm/gen/spec"

// Status is an error.
//
//kvcm:opaque
//kvcm:status
//kvcm:since 1
type Status struct{}

// F takes values and a flag.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param flag in,into=values.X The flag.
//kvcm:param values borrowed,nullable,len=numValues,slice,go=int The values.
//kvcm:param numValues in The number of values.
type F func(flag int32, values spec.In[int32], numValues spec.Size) *Status
