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
	"github.com/kvcm/kvcm/core/config"
)

// goTokens copies a C token array (named name) beside its digests.
func goTokens(p *C.kvcm__const_kvcm_token, n C.size_t, name string) ([]config.Token, error) {
	ts, err := cArray(p, n, name)
	if err != nil {
		return nil, err
	}
	out := make([]config.Token, len(ts))
	for i, t := range ts {
		out[i] = config.Token(t)
	}
	return out, nil
}

// goDigests copies a sequence's digest tokens: positions (named name) and
// their 32 bytes each.
func goDigests(positions *C.kvcm__const_size_t, n C.size_t, bytes *C.kvcm__const_char, blen C.size_t, name string) ([]blockhash.DigestAt, error) {
	ps, err := cArray(positions, n, name)
	if err != nil {
		return nil, err
	}
	if uint64(blen) != uint64(len(ps))*blockhash.DigestSize {
		return nil, argError(name, "%d digests need %d digest bytes, got %d", len(ps), uint64(len(ps))*blockhash.DigestSize, uint64(blen))
	}
	if len(ps) == 0 {
		return nil, nil
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(bytes)), int(blen))
	out := make([]blockhash.DigestAt, len(ps))
	for i, p := range ps {
		out[i].Pos = int(min(uint64(p), uint64(^uint(0)>>1)))
		copy(out[i].Digest[:], raw[i*blockhash.DigestSize:])
	}
	return out, nil
}

func glueBlockKeys(algo C.kvcm_block_key, scope *C.kvcm__const_kvcm_reuse_scope, hasLoRA C.bool, tpb C.int32_t,
	tokens *C.kvcm__const_kvcm_token, n C.size_t, positions *C.kvcm__const_size_t, nd C.size_t,
	bytes *C.kvcm__const_char, blen C.size_t, partial C.bool, keys *C.uint64_t, capacity C.size_t, needed *C.size_t) error {
	sc, err := goScope(scope, bool(hasLoRA), "scope")
	if err != nil {
		return err
	}
	ts, err := goTokens(tokens, n, "tokens")
	if err != nil {
		return err
	}
	ds, err := goDigests(positions, nd, bytes, blen, "digest_positions")
	if err != nil {
		return err
	}
	ks, err := blockhash.ChainDigests(blockhash.Algorithm(algo), sc, int(tpb), ts, ds, bool(partial))
	if err != nil {
		return argError("block_keys", "%v", err)
	}
	return fill(ks, keys, capacity, needed, func(k blockhash.Key) C.uint64_t { return C.uint64_t(k) })
}

func glueKVCacheCommitDigests(c *kvCacheObj, tokens *C.kvcm__const_kvcm_token, n C.size_t, positions *C.kvcm__const_size_t,
	nd C.size_t, bytes *C.kvcm__const_char, blen C.size_t, isEnd C.bool) error {
	ts, err := goTokens(tokens, n, "tokens")
	if err != nil {
		return err
	}
	ds, err := goDigests(positions, nd, bytes, blen, "digest_positions")
	if err != nil {
		return err
	}
	return c.CommitDigests(ts, ds, bool(isEnd))
}

func glueKVCacheGetCommittedDigests(c *kvCacheObj, positions *C.size_t, bytes *C.uint8_t, capacity C.size_t, needed *C.size_t) error {
	ds := c.Core().CommittedDigests()
	*needed = C.size_t(len(ds))
	if positions == nil && bytes == nil && capacity == 0 {
		return nil
	}
	ps, err := cSlice(positions, capacity, "capacity")
	if err != nil {
		return err
	}
	if uint64(capacity) < uint64(len(ds)) {
		return errorf(codeBufferTooSmall, "need room for %d digests, got %d", len(ds), uint64(capacity))
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(bytes)), len(ds)*blockhash.DigestSize)
	for i, d := range ds {
		ps[i] = C.size_t(d.Pos)
		copy(raw[i*blockhash.DigestSize:], d.Digest[:])
	}
	return nil
}

func glueManagerProbeReuseDigests(mgr *managerObj, scope *C.kvcm__const_kvcm_reuse_scope, hasLoRA C.bool, tokens *C.kvcm__const_kvcm_token,
	n C.size_t, positions *C.kvcm__const_size_t, nd C.size_t, bytes *C.kvcm__const_char, blen C.size_t, out *C.int64_t) error {
	sc, err := goScope(scope, bool(hasLoRA), "scope")
	if err != nil {
		return err
	}
	ts, err := goTokens(tokens, n, "tokens")
	if err != nil {
		return err
	}
	ds, err := goDigests(positions, nd, bytes, blen, "digest_positions")
	if err != nil {
		return err
	}
	if err := mgr.Open(); err != nil {
		return err
	}
	r, err := mgr.Core().ProbeReuseDigests(sc, ts, ds)
	*out = C.int64_t(r)
	return err
}

func glueManagerProbeFirstNewBlockKeyDigests(mgr *managerObj, scope *C.kvcm__const_kvcm_reuse_scope, hasLoRA C.bool, tokens *C.kvcm__const_kvcm_token,
	n C.size_t, positions *C.kvcm__const_size_t, nd C.size_t, bytes *C.kvcm__const_char, blen C.size_t, key *C.uint64_t, found *C.bool) error {
	sc, err := goScope(scope, bool(hasLoRA), "scope")
	if err != nil {
		return err
	}
	ts, err := goTokens(tokens, n, "tokens")
	if err != nil {
		return err
	}
	ds, err := goDigests(positions, nd, bytes, blen, "digest_positions")
	if err != nil {
		return err
	}
	*key, *found = 0, false
	if err := mgr.Open(); err != nil {
		return err
	}
	k, ok, err := mgr.Core().ProbeFirstNewBlockKeyDigests(sc, ts, ds)
	*key, *found = C.uint64_t(k), C.bool(ok)
	return err
}

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
	err = drainBlockEvents(mgr, events, eventsCap, tokens, tokensCap, func(pos int, d *blockhash.Digest) {
		ps[nd] = C.size_t(pos)
		copy(raw[nd*blockhash.DigestSize:], d[:])
		nd++
	}, numEvents, numTokens, dropped)
	*numDigests = C.size_t(nd)
	return err
}
