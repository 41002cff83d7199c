// Package gostring passes a Go string, which the ABI refuses.
package gostring

// F takes a Go string.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param s in A string.
type F func(s string)
