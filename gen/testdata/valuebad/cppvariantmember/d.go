// Package cppvariantmember fixes the enum field to a member it lacks.
package cppvariantmember

// S is split by kind.
//
//kvcm:struct
//kvcm:cppns c
//kvcm:cppvalue S
//kvcm:cppvariant A k=kTwo args=x:v
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
	EOne E = 0
)
