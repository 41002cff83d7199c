// Package pyvariantinto sends an own field to a field the parent lacks.
package pyvariantinto

import "github.com/kvcm/kvcm/gen/spec"

// S is split by kind.
//
//kvcm:struct
//kvcm:pyvariant A k=ONE fields=x,y
//kvcm:pyvariantfield A y int 0 into=nope | Y.
//kvcm:since 1
type S struct {
	// K is the kind.
	K E
	// X is a value.
	X int32
}

// P holds them.
//
//kvcm:struct
//kvcm:since 1
type P struct {
	// Items are the items.
	Items spec.In[S] `len:"NumItems" own:"borrowed"`
	// NumItems is the length of items.
	NumItems spec.Size
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
