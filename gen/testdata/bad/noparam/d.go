// Package noparam has an undocumented parameter.
package noparam

// F takes an undocumented value.
//
//kvcm:since 1
//kvcm:thread any
type F func(v int32)
