// Package pyenumname renames an enum member that does not exist.
package pyenumname

// E is an enum.
//
//kvcm:enum trim=E cprefix=KVCM_E_ cpp=E
//kvcm:pyenum PyE ONE=FIRST
//kvcm:since 1
type E int32

const (
	// EZero is zero.
	EZero E = 0
)
