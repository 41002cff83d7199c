// Package pyconfigtype asks for a Python value type of a callback field.
package pyconfigtype

import "github.com/kvcm/kvcm/gen/spec"

// S has user data.
//
//kvcm:struct
//kvcm:pyconfig S
//kvcm:since 1
type S struct {
	// User is user data.
	User spec.VoidPtr `own:"borrowed"`
}
