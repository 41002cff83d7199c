package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdint.h>
#include "kvcm/kvcm.h"
*/
import "C"

// DecodeSteps calls kvcm_kv_cache_decode_steps.
func DecodeSteps(c uint64, tokens []int32) error {
	var a arena
	defer a.free()
	var p *C.kvcm_token
	if len(tokens) > 0 {
		p = tokensOf(&a, tokens)
	}
	return status(C.kvcm_kv_cache_decode_steps(C.kvcm_kv_cache(c), p, C.size_t(len(tokens))))
}

// DecodeStepsNull calls kvcm_kv_cache_decode_steps with NULL tokens.
func DecodeStepsNull(c uint64, n int) error {
	return status(C.kvcm_kv_cache_decode_steps(C.kvcm_kv_cache(c), nil, C.size_t(n)))
}
