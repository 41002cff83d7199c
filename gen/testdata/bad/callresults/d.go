// Package callresults calls a function whose results are not the outputs.
package callresults

import "github.com/kvcm/kvcm/gen/spec"

// Status is an error.
//
//kvcm:opaque
//kvcm:status
//kvcm:since 1
type Status struct{}

// F counts the bits of a value.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:call math/bits.Add64
//kvcm:param v in The value.
//kvcm:param out out,result Receives the count.
type F func(v uint64, out spec.Out[int32]) *Status
