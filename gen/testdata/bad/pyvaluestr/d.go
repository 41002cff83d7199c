// Package pyvaluestr asks for a Python value type of a struct with a string.
package pyvaluestr

import "github.com/kvcm/kvcm/gen/spec"

// S has a name.
//
//kvcm:struct
//kvcm:pyvalue
//kvcm:since 1
type S struct {
	// Name is a name.
	Name spec.CStr `own:"borrowed"`
}
