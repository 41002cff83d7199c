package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/blockhash"
)

// ---- Create and destroy ----

func glueManagerCreate(mc abimodel.ManagerConfig, codecArg *coldPageCodecArg, out *C.kvcm_manager) error {
	if codecArg.err != nil {
		return codecArg.err
	}
	cfg, opts, err := mc.Resolve()
	if err != nil {
		return err
	}
	opts.Codec = codecArg.owned // consumed by New, also on failure
	opts.Builtin = codecArg.builtin
	m, err := abimodel.New(cfg, opts)
	if err != nil {
		return err
	}
	obj := &managerObj{Manager: m}
	obj.handle = newHandle(obj)
	*out = C.kvcm_manager(obj.handle)
	return nil
}

func glueManagerDestroy(mgr *managerObj) error {
	if !deleteHandle(mgr.handle) {
		return errorf(codeInvalidHandle, "manager: %#x was destroyed concurrently", mgr.handle)
	}
	return mgr.Close()
}

// ---- Events ----

func glueManagerDrainEvents(mgr *managerObj, events *C.kvcm_cache_event, eventsCap C.size_t, tokens *C.kvcm_token, tokensCap C.size_t,
	numEvents *C.size_t, numTokens *C.size_t, dropped *C.uint64_t) error {
	return drainEvents(mgr.Events().DrainCacheEvents, events, eventsCap, tokens, tokensCap, nil, numEvents, numTokens, dropped,
		func(ev core.CacheEvent, toks *C.kvcm_token, n C.size_t) C.kvcm_cache_event {
			out := toCCacheEvent(ev)
			out.tokens, out.num_tokens = toks, n
			return out
		})
}

func glueManagerDrainBlockEvents(mgr *managerObj, events *C.kvcm_block_event, eventsCap C.size_t, tokens *C.kvcm_token, tokensCap C.size_t,
	numEvents *C.size_t, numTokens *C.size_t, dropped *C.uint64_t) error {
	return drainEvents(mgr.Events().Drain, events, eventsCap, tokens, tokensCap, nil, numEvents, numTokens, dropped, blockEvent)
}

func blockEvent(ev core.CacheEvent, toks *C.kvcm_token, n C.size_t) C.kvcm_block_event {
	out := toCBlockEvent(ev)
	out.tokens, out.num_tokens = toks, n
	return out
}

// drainEvents writes the events drain takes into the caller's buffers, each
// event's tokens a run of the tokens buffer (NULL for none), converted by
// conv; each stored block's digest tokens go to onDigest (nil: dropped),
// with their positions in the tokens buffer.
func drainEvents[E any](drain func(maxEvents, maxTokens int) ([]core.CacheEvent, uint64, int), events *E, eventsCap C.size_t,
	tokens *C.kvcm_token, tokensCap C.size_t, onDigest func(pos int, d *blockhash.Digest), numEvents, numTokens *C.size_t, dropped *C.uint64_t,
	conv func(core.CacheEvent, *C.kvcm_token, C.size_t) E) error {
	evs, err := cSlice(events, eventsCap, "events_cap")
	if err != nil {
		return err
	}
	toks, err := cSlice(tokens, tokensCap, "tokens_cap")
	if err != nil {
		return err
	}
	got, d, need := drain(len(evs), len(toks))
	if need > 0 {
		*numTokens = C.size_t(need)
		return errorf(codeBufferTooSmall, "the oldest event has %d tokens; tokens_cap is %d", need, uint64(tokensCap))
	}
	ntok := 0
	for i, ev := range got {
		if onDigest != nil {
			for j := range ev.Digests {
				onDigest(ntok+ev.Digests[j].Pos, &ev.Digests[j].Digest)
			}
		}
		var p *C.kvcm_token
		if len(ev.Tokens) > 0 {
			p = &toks[ntok]
		}
		for _, t := range ev.Tokens {
			toks[ntok] = C.kvcm_token(t)
			ntok++
		}
		evs[i] = conv(ev, p, C.size_t(len(ev.Tokens)))
	}
	*numEvents, *numTokens = C.size_t(len(got)), C.size_t(ntok)
	if dropped != nil {
		*dropped = C.uint64_t(d)
	}
	return nil
}
