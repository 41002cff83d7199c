package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdint.h>
#include "kvcm/kvcm.h"
*/
import "C"

const (
	EventPriorityUpdated = int32(C.KVCM_EVENT_BLOCK_PRIORITY_UPDATED)
	DefaultPriority      = int32(C.KVCM_DEFAULT_PRIORITY)
	MaxPriority          = int32(C.KVCM_MAX_PRIORITY)
)

// SetBlockPriorities calls kvcm_manager_set_block_priorities.
func SetBlockPriorities(m uint64, sc Scope, keys []uint64, priorities []int32) (int, error) {
	var a arena
	defer a.free()
	kp, nk := keysArg(&a, keys)
	prs := cArray[C.int32_t](&a, len(priorities))
	for i, p := range priorities {
		prs[i] = C.int32_t(p)
	}
	var pp *C.int32_t
	if len(prs) > 0 {
		pp = &prs[0]
	}
	var out C.size_t
	err := status(C.kvcm_manager_set_block_priorities(C.kvcm_manager(m), sc.build(&a), C.bool(sc.HasLoRA),
		kp, nk, pp, C.size_t(len(prs)), &out))
	return int(out), err
}

// NullArg names the NULL argument of SetBlockPrioritiesNull.
type NullArg int

const (
	NullKeys       NullArg = iota // keys NULL, num_keys 1
	NullPriorities                // priorities NULL, num_priorities 1
	NullScope                     // scope NULL
	NullOut                       // out NULL
)

// SetBlockPrioritiesNull calls kvcm_manager_set_block_priorities for one
// key and priority with the argument null names NULL.
func SetBlockPrioritiesNull(m uint64, key uint64, priority int32, null NullArg) error {
	var a arena
	defer a.free()
	sc := Scope{}.build(&a)
	k := cArray[C.uint64_t](&a, 1)
	p := cArray[C.int32_t](&a, 1)
	k[0], p[0] = C.uint64_t(key), C.int32_t(priority)
	kp, pp := &k[0], &p[0]
	var out C.size_t
	op := &out
	switch null {
	case NullKeys:
		kp = nil
	case NullPriorities:
		pp = nil
	case NullScope:
		sc = nil
	case NullOut:
		op = nil
	}
	return status(C.kvcm_manager_set_block_priorities(C.kvcm_manager(m), sc, false, kp, 1, pp, 1, op))
}
