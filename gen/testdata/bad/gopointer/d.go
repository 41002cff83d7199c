// Package gopointer passes a bare Go pointer instead of spec.In or spec.Out.
package gopointer

// F takes a pointer.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param p in A pointer.
type F func(p *int32)
