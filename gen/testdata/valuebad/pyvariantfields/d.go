// Package pyvariantfields names a field the struct lacks.
package pyvariantfields

// S is split by kind.
//
//kvcm:struct
//kvcm:pyvariant A k=ONE fields=x,y
//kvcm:since 1
type S struct {
	// K is the kind.
	K E
	// X is a value.
	X int32
}

// E is a kind.
//
//kvcm:enum trim=E cprefix=KVCM_E_
//kvcm:since 1
type E int32

const (
	// EOne is one.
	EOne E = 1
)
