// Package cppvaluealias names a C++ value type as the C struct's alias.
package cppvaluealias

// S has a size.
//
//kvcm:struct
//kvcm:cppvalue S
//kvcm:since 1
type S struct {
	// Size is a size.
	Size int64
}
