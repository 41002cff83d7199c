// Package cppvalueorder lists a field its C++ value type does not have.
package cppvalueorder

// S has a size.
//
//kvcm:struct
//kvcm:cppns c
//kvcm:cppvalue S order=nope
//kvcm:since 1
type S struct {
	// Size is a size.
	Size int64
}
