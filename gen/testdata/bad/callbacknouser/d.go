// Package callbacknouser converts a callback field without naming the user
// data it is called with.
package callbacknouser

import "github.com/kvcm/kvcm/gen/spec"

// Prio is a priority callback.
//
//kvcm:callback
//kvcm:since 1
//kvcm:gocaller github.com/kvcm/kvcm/core/abimodel.BlockPriorityFunc
type Prio func(userData spec.VoidPtr, block int64, priority spec.Out[int32]) int32

// O holds the callback without a user tag.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go in github.com/kvcm/kvcm/core/abimodel.KVCacheOptions
type O struct {
	// Priority is the callback.
	Priority Prio `nullable:"true" go:"BlockPriority"`
	// UserData is passed to priority.
	UserData spec.VoidPtr `nullable:"true" own:"borrowed" go:"-"`
}
