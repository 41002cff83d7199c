package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"unsafe"

	"github.com/kvcm/kvcm/core/blockhash"
)

func glueManagerDrainBlockEventsDigests(mgr *managerObj, events *C.kvcm_block_event, eventsCap C.size_t, tokens *C.kvcm_token,
	tokensCap C.size_t, positions *C.size_t, bytes *C.uint8_t, numEvents, numTokens, numDigests *C.size_t, dropped *C.uint64_t) error {
	ps, err := cSlice(positions, tokensCap, "tokens_cap")
	if err != nil {
		return err
	}
	var raw []byte
	if len(ps) > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(bytes)), len(ps)*blockhash.DigestSize)
	}
	nd := 0
	err = drainEvents(mgr.Events().Drain, events, eventsCap, tokens, tokensCap, func(pos int, d *blockhash.Digest) {
		ps[nd] = C.size_t(pos)
		copy(raw[nd*blockhash.DigestSize:], d[:])
		nd++
	}, numEvents, numTokens, dropped, blockEvent)
	*numDigests = C.size_t(nd)
	return err
}
