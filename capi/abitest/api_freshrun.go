package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdint.h>
#include "kvcm/kvcm.h"
*/
import "C"

// CreateCacheFresh creates a cache for tokens with a fresh run of k blocks
// from block from (kvcm_kv_cache_options.fresh_blocks, fresh_from_block).
func CreateCacheFresh(m uint64, tokens []int32, from, k int64) (uint64, error) {
	var a arena
	defer a.free()
	o := (*C.kvcm_kv_cache_options)(a.alloc(C.sizeof_kvcm_kv_cache_options))
	o.struct_size, o.abi_version = C.sizeof_kvcm_kv_cache_options, C.KVCM_ABI_VERSION
	o.input_tokens, o.num_input_tokens = tokensOf(&a, tokens), C.size_t(len(tokens))
	o.fresh_blocks, o.fresh_from_block = C.int64_t(k), C.int64_t(from)
	var c C.kvcm_kv_cache
	err := status(C.kvcm_kv_cache_create(C.kvcm_manager(m), o, &c))
	return uint64(c), err
}

// FreshRange calls kvcm_kv_cache_get_fresh_range.
func FreshRange(c uint64) (from, to int64, err error) {
	var f, t C.int64_t
	err = status(C.kvcm_kv_cache_get_fresh_range(C.kvcm_kv_cache(c), &f, &t))
	return int64(f), int64(t), err
}

// WaitFreshTail calls kvcm_kv_cache_wait_fresh_tail.
func WaitFreshTail(c, stream uint64) error {
	return status(C.kvcm_kv_cache_wait_fresh_tail(C.kvcm_kv_cache(c), C.kvcm_stream(stream)))
}
