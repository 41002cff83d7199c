package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import "github.com/kvcm/kvcm/core/blockhash"

// glueManagerDrainBlockEventsDigests drains as kvcm_manager_drain_block_events
// (abimodel.EventQueue.Drain's rule) and writes each stored block's digest
// tokens too: their positions in the tokens buffer and 32 bytes each.
func glueManagerDrainBlockEventsDigests(mgr *managerObj, events *C.kvcm_block_event, eventsCap C.size_t, tokens *C.kvcm_token,
	tokensCap C.size_t, positions *C.size_t, bytes *C.uint8_t, numEvents, numTokens, numDigests *C.size_t, dropped *C.uint64_t) error {
	evs, err := cSlice(events, eventsCap, "events_cap")
	if err != nil {
		return err
	}
	toks, err := cSlice(tokens, tokensCap, "tokens_cap")
	if err != nil {
		return err
	}
	ps, err := cSlice(positions, tokensCap, "tokens_cap")
	if err != nil {
		return err
	}
	raw, err := cSlice(bytes, tokensCap*blockhash.DigestSize, "tokens_cap")
	if err != nil {
		return err
	}
	got, need, d := mgr.Events().Drain(len(evs), len(toks))
	if need > 0 {
		*numTokens = C.size_t(need)
		return errorf(codeBufferTooSmall, "the oldest event has %d tokens; tokens_cap is %d", need, uint64(tokensCap))
	}
	ntok, nd := 0, 0
	for i, ev := range got {
		for _, dg := range ev.Digests {
			ps[nd] = C.size_t(ntok + dg.Pos)
			for j, b := range dg.Digest {
				raw[nd*blockhash.DigestSize+j] = C.uint8_t(b)
			}
			nd++
		}
		evs[i] = toCBlockEvent(ev, toks[ntok:])
		ntok += len(ev.Tokens)
	}
	*numEvents, *numTokens, *numDigests = C.size_t(len(got)), C.size_t(ntok), C.size_t(nd)
	if dropped != nil {
		*dropped = C.uint64_t(d)
	}
	return nil
}
