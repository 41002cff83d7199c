// Package pyvalueargs gives //kvcm:pyvalue an argument it does not know.
package pyvalueargs

// S counts.
//
//kvcm:struct
//kvcm:pyvalue S frozen
//kvcm:since 1
type S struct {
	// N is a count.
	N int64
}
