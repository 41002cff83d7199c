// Package multi has a function with two results, which the ABI refuses.
package multi

// F returns two values.
//
//kvcm:since 1
//kvcm:thread any
type F func() (int32, int32)
