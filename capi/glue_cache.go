package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"fmt"
	"sync/atomic"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/cp"
	"github.com/kvcm/kvcm/core/layout"
)

// kvCacheObj is what a kvcm_kv_cache handle refers to.
type kvCacheObj struct {
	handle uint64
	mgr    *managerObj
	c      *core.KVCache
	tc     *cp.TrackedCache // non-nil when a CP index is notified
	cpRef  *cpObj           // the index tc notifies
	closed atomic.Bool
}

// close closes the cache; a tracked one notifies its terminal free first
// and lets go of its index. Only the first call does anything, so the
// index's reference is released once.
func (c *kvCacheObj) close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if c.tc == nil {
		return c.c.Close()
	}
	err := c.tc.Close()
	c.cpRef.release()
	return err
}

func glueKVCacheCreate(mgr *managerObj, opts *C.kvcm__const_kvcm_kv_cache_options, out *C.kvcm_kv_cache) error {
	scope, err := goScope(&opts.scope, "options.scope")
	if err != nil {
		return err
	}
	tokens, err := goTokens(opts.input_tokens, opts.num_input_tokens, "options.input_tokens")
	if err != nil {
		return err
	}
	co := core.CacheOptions{Scope: scope, InputTokens: tokens}
	if opts.priority != nil {
		fn, user := opts.priority, C.kvcm__get_kv_cache_options_priority_user_data(opts)
		co.Priority = func(block int) int {
			var pr C.int32_t
			if rc := C.kvcm__call_priority_func(fn, user, C.int64_t(block), &pr); rc != 0 {
				// The core fails the commit, changing nothing, when the
				// priority function panics.
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
	mgr.mu.Lock()
	if mgr.gone {
		mgr.mu.Unlock()
		return errorf(codeInvalidHandle, "manager is being destroyed")
	}
	c, err := mgr.m.CreateKVCache(co)
	if err != nil {
		mgr.mu.Unlock()
		return err
	}
	obj := &kvCacheObj{mgr: mgr, c: c}
	var added []blockhash.Key
	if idx := mgr.attached; idx != nil && requestID != "" {
		idx.acquire()
		obj.tc, added = cp.NewTracker(mgr.m, idx.index).Wrap(requestID, c, co)
		obj.cpRef = idx
	}
	obj.handle = newHandle(obj)
	mgr.caches[obj.handle] = obj
	mgr.mu.Unlock()
	// Notified without the manager's locks: the index may be foreign code.
	if len(added) > 0 {
		obj.cpRef.index.NotifyBlocksAllocated(requestID, added)
	}
	*out = C.kvcm_kv_cache(obj.handle)
	return nil
}

func glueKVCacheClose(c *kvCacheObj) error {
	// The handle is deleted under the manager's lock, as glueManagerDestroy
	// deletes the handles of the caches it closes: exactly one closes it.
	mgr := c.mgr
	mgr.mu.Lock()
	if !deleteHandle(c.handle) {
		mgr.mu.Unlock()
		return errorf(codeInvalidHandle, "cache: %#x was closed concurrently (by kvcm_kv_cache_close or kvcm_manager_destroy)", c.handle)
	}
	delete(mgr.caches, c.handle)
	mgr.closing.Add(1)
	mgr.mu.Unlock()
	defer mgr.closing.Done()
	return c.close()
}

func glueKVCacheResume(c *kvCacheObj, stream C.kvcm_stream) error {
	if stream == 0 {
		return argError("stream", "is 0")
	}
	s, err := c.mgr.dev.StreamFromHandle(uintptr(stream))
	if err != nil {
		return argError("stream", "%#x is not a stream of the manager's device: %v", uintptr(stream), err)
	}
	return c.c.Resume(s)
}

func glueKVCacheSuspend(c *kvCacheObj) error { return c.c.Suspend() }

func glueKVCacheResize(c *kvCacheObj, capacity, history C.int64_t) error {
	if capacity < 0 || int64(capacity) > maxElems {
		return argError("capacity", "must be in [0, 2^40], got %d", int64(capacity))
	}
	h := int(history)
	if history < 0 {
		h = -1
	} else if int64(history) > maxElems {
		return argError("history_length", "%d is too large", int64(history))
	}
	return c.c.Resize(int(capacity), h)
}

func glueKVCacheCommit(c *kvCacheObj, tokens *C.kvcm__const_kvcm_token, n C.size_t, isEnd C.bool) error {
	ts, err := goTokens(tokens, n, "tokens")
	if err != nil {
		return err
	}
	if c.tc != nil {
		return c.tc.Commit(ts, bool(isEnd))
	}
	return c.c.Commit(ts, bool(isEnd))
}

func glueKVCacheStopCommitting(c *kvCacheObj) error {
	c.c.StopCommitting()
	return nil
}

func glueKVCachePrefetch(c *kvCacheObj, level C.kvcm_cache_level) error {
	return c.c.Prefetch(layout.CacheLevel(level))
}

func glueKVCacheGetStatus(c *kvCacheObj, out *C.kvcm_cache_status) error {
	*out = C.kvcm_cache_status(c.c.Status())
	return nil
}

func glueKVCacheGetID(c *kvCacheObj, out *C.uint64_t) error {
	*out = C.uint64_t(c.c.ID())
	return nil
}

func glueKVCacheGetNumCommittedTokens(c *kvCacheObj, out *C.int64_t) error {
	*out = C.int64_t(c.c.NumCommittedTokens())
	return nil
}

func glueKVCacheGetHistoryLength(c *kvCacheObj, out *C.int64_t) error {
	*out = C.int64_t(c.c.HistoryLength())
	return nil
}

func glueKVCacheGetCapacity(c *kvCacheObj, out *C.int64_t) error {
	*out = C.int64_t(c.c.Capacity())
	return nil
}

func glueKVCacheGetReusedTokens(c *kvCacheObj, out *C.int64_t) error {
	*out = C.int64_t(c.c.ReusedTokens())
	return nil
}

func glueKVCacheGetBasePageIndices(c *kvCacheObj, lg C.kvcm_layer_group_id, indices *C.int32_t, capacity C.size_t, needed *C.size_t) error {
	idx, err := c.c.BasePageIndices(layout.LayerGroupID(lg))
	if err != nil {
		return err
	}
	return fill(idx, indices, capacity, needed, func(i int32) C.int32_t { return C.int32_t(i) })
}
