package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"fmt"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

func glueKVCacheCreate(mgr *managerObj, opts *C.kvcm__const_kvcm_kv_cache_options, out *C.kvcm_kv_cache) error {
	hasLoRA := C.kvcm__has_kv_cache_options_scope_has_lora_id(opts) != 0 && bool(opts.scope_has_lora_id)
	scope, err := goScope(&opts.scope, hasLoRA, "options.scope")
	if err != nil {
		return err
	}
	tokens, err := goTokens(opts.input_tokens, opts.num_input_tokens, "options.input_tokens")
	if err != nil {
		return err
	}
	co := core.CacheOptions{Scope: scope, InputTokens: tokens}
	if C.kvcm__has_kv_cache_options_text_only(opts) != 0 {
		co.TextOnly = bool(opts.text_only)
		if co.InputDigests, err = goDigests(opts.input_digest_positions, opts.num_input_digests,
			opts.input_digest_bytes, opts.input_digest_bytes_len, "options.input_digest_positions"); err != nil {
			return err
		}
	}
	user := C.kvcm__get_kv_cache_options_priority_user_data(opts)
	var lgFn C.kvcm_layer_group_priority_func
	if C.kvcm__has_kv_cache_options_layer_group_priority(opts) != 0 {
		lgFn = opts.layer_group_priority
	}
	switch {
	case lgFn != nil && opts.priority != nil:
		return argError("options.layer_group_priority", "is set together with options.priority; set one of them")
	case lgFn != nil:
		co.Priority = func(block int, lc layout.LayerGroupID) int {
			var pr C.int32_t
			if rc := C.kvcm__call_layer_group_priority_func(lgFn, user, C.int64_t(block), C.kvcm_layer_group_id(lc), &pr); rc != 0 {
				// The core fails the commit, changing nothing, when the
				// priority function panics.
				panic(fmt.Sprintf("kvcm_layer_group_priority_func returned %d", int32(rc)))
			}
			return int(pr)
		}
	case opts.priority != nil:
		fn := opts.priority
		co.Priority = func(block int, _ layout.LayerGroupID) int {
			var pr C.int32_t
			if rc := C.kvcm__call_priority_func(fn, user, C.int64_t(block), &pr); rc != 0 {
				panic(fmt.Sprintf("kvcm_priority_func returned %d", int32(rc)))
			}
			return int(pr)
		}
	}
	if opts.request_id == nil && opts.request_id_len != 0 {
		return argError("options.request_id", "is NULL but request_id_len is %d", uint64(opts.request_id_len))
	}
	requestID, err := goID(opts.request_id, opts.request_id_len, "options.request_id")
	if err != nil {
		return err
	}
	obj, onClose := newKVCacheObj()
	c, err := mgr.CreateCache(abimodel.CacheOptions{CacheOptions: co, RequestID: requestID, OnClose: onClose})
	if err != nil {
		return err
	}
	h, ok := obj.publish(c)
	if !ok {
		return errorf(codeInvalidHandle, "manager: %#x was destroyed concurrently", mgr.handle)
	}
	*out = C.kvcm_kv_cache(h)
	return nil
}

func glueKVCacheClose(c *kvCacheObj) error {
	// The handle is consumed: exactly one of concurrent closes (or the
	// manager's destroy, through OnClose) frees it.
	if !deleteHandle(c.handle) {
		return errorf(codeInvalidHandle, "cache: %#x was closed concurrently (by kvcm_kv_cache_close or kvcm_manager_destroy)", c.handle)
	}
	return c.Close()
}

func glueKVCacheResume(c *kvCacheObj, stream C.kvcm_stream) error {
	s, err := c.Manager().Stream(uintptr(stream))
	if err != nil {
		return err
	}
	return c.Resume(s)
}

func glueKVCacheSetStream(c *kvCacheObj, stream C.kvcm_stream) error {
	s, err := c.Manager().Stream(uintptr(stream))
	if err != nil {
		return err
	}
	return c.SetStream(s)
}

func glueKVCacheGetCommittedTokens(c *kvCacheObj, tokens *C.kvcm_token, capacity C.size_t, needed *C.size_t) error {
	return fill(c.Core().CommittedTokens(), tokens, capacity, needed, func(t config.Token) C.kvcm_token { return C.kvcm_token(t) })
}

func glueKVCacheSuspend(c *kvCacheObj) error { return c.Suspend() }

func glueKVCacheResize(c *kvCacheObj, capacity, history C.int64_t) error {
	return c.Resize(int64(capacity), int64(history))
}

func glueKVCacheCommit(c *kvCacheObj, tokens *C.kvcm__const_kvcm_token, n C.size_t, isEnd C.bool) error {
	ts, err := goTokens(tokens, n, "tokens")
	if err != nil {
		return err
	}
	return c.Commit(ts, bool(isEnd))
}

func glueKVCacheCommitBeamSearch(c *kvCacheObj, tokens *C.kvcm__const_kvcm_token, n C.size_t, indices *C.kvcm__const_int32_t, numIndices C.size_t, isEnd C.bool) error {
	ts, err := goTokens(tokens, n, "tokens")
	if err != nil {
		return err
	}
	var parents []int
	if indices != nil {
		is, err := cArray(indices, numIndices, "beam_search_indices")
		if err != nil {
			return err
		}
		parents = make([]int, len(is))
		for i, p := range is {
			parents[i] = int(p)
		}
	}
	return c.CommitBeamSearch(ts, parents, bool(isEnd))
}

func glueKVCacheGetBeamWidth(c *kvCacheObj, out *C.int32_t) error {
	*out = C.int32_t(c.Core().BeamWidth())
	return nil
}

func glueKVCacheSetBeamWidth(c *kvCacheObj, width C.int32_t) error {
	return c.Core().SetBeamWidth(int(width))
}

func glueKVCacheStopCommitting(c *kvCacheObj) error {
	c.StopCommitting()
	return nil
}

func glueKVCachePrefetch(c *kvCacheObj, level C.kvcm_cache_level) error {
	return c.Prefetch(layout.CacheLevel(level))
}

func glueKVCacheGetStatus(c *kvCacheObj, out *C.kvcm_cache_status) error {
	*out = C.kvcm_cache_status(c.Core().Status())
	return nil
}

func glueKVCacheGetID(c *kvCacheObj, out *C.uint64_t) error {
	*out = C.uint64_t(c.Core().ID())
	return nil
}

func glueKVCacheGetNumCommittedTokens(c *kvCacheObj, out *C.int64_t) error {
	*out = C.int64_t(c.Core().NumCommittedTokens())
	return nil
}

func glueKVCacheGetHistoryLength(c *kvCacheObj, out *C.int64_t) error {
	*out = C.int64_t(c.Core().HistoryLength())
	return nil
}

func glueKVCacheGetCapacity(c *kvCacheObj, out *C.int64_t) error {
	*out = C.int64_t(c.Core().Capacity())
	return nil
}

func glueKVCacheGetReusedTokens(c *kvCacheObj, out *C.int64_t) error {
	*out = C.int64_t(c.Core().ReusedTokens())
	return nil
}

func glueKVCacheGetBasePageIndices(c *kvCacheObj, lg C.kvcm_layer_group_id, indices *C.int32_t, capacity C.size_t, needed *C.size_t) error {
	idx, err := c.Core().BasePageIndices(layout.LayerGroupID(lg))
	if err != nil {
		return err
	}
	return fill(idx, indices, capacity, needed, func(i int32) C.int32_t { return C.int32_t(i) })
}

func glueKVCacheGetBeamBasePageIndices(c *kvCacheObj, lg C.kvcm_layer_group_id, beam C.int32_t, indices *C.int32_t, capacity C.size_t, needed *C.size_t) error {
	idx, err := c.Core().BasePageIndicesOfBeam(layout.LayerGroupID(lg), int(beam))
	if err != nil {
		return err
	}
	return fill(idx, indices, capacity, needed, func(i int32) C.int32_t { return C.int32_t(i) })
}

func glueKVCacheGetSsmBlockBaseIndex(c *kvCacheObj, lg C.kvcm_layer_group_id, out *C.int32_t) error {
	s, err := c.Core().SsmBlockBaseIndex(layout.LayerGroupID(lg))
	if err != nil {
		return err
	}
	*out = C.int32_t(s)
	return nil
}

func glueKVCacheGetReuseDiagnostics(c *kvCacheObj, out *C.kvcm_reuse_diagnostics) error {
	d := c.Core().ReuseDiagnostics()
	*out = C.kvcm_reuse_diagnostics{content_tokens: C.int64_t(d.ContentTokens), attention_tokens: C.int64_t(d.AttentionTokens)}
	return nil
}

func glueKVCacheGetStats(c *kvCacheObj, out *C.kvcm_block_stats) error {
	*out = cBlockStats(c.Core().Stats())
	return nil
}

func glueKVCacheGetCachedTokensByLevel(c *kvCacheObj, tokens *C.int64_t, capacity C.size_t, needed *C.size_t) error {
	return fill(c.Core().CachedTokensByLevel(), tokens, capacity, needed, func(n int) C.int64_t { return C.int64_t(n) })
}
