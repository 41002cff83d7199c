// Package pyvaluecounters asks for a Python record of counters with a
// float field, whose default 0 would be an int.
package pyvaluecounters

// S counts.
//
//kvcm:struct
//kvcm:pyvalue counters
//kvcm:since 1
type S struct {
	// N is a count.
	N int64
	// Rate is a rate.
	Rate float64
}
