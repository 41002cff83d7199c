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
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

func glueKVCacheCreate(mgr *managerObj, opts *C.kvcm__const_kvcm_kv_cache_options, out *C.kvcm_kv_cache) error {
	ko, err := fromCKVCacheOptions((*C.kvcm_kv_cache_options)(opts), "options")
	if err != nil {
		return err
	}
	o, err := ko.Resolve()
	if err != nil {
		return err
	}
	obj := &kvCacheObj{}
	o.OnOpen = func(c *abimodel.Cache) { obj.Cache, obj.handle = c, newHandle(obj) }
	o.OnClose = func() { deleteHandle(obj.handle) }
	if _, err := mgr.CreateCache(o); err != nil {
		return err
	}
	*out = C.kvcm_kv_cache(obj.handle)
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

func glueKVCacheGetCommittedTokens(c *kvCacheObj) ([]config.Token, error) {
	return c.Core().CommittedTokens(), nil
}

func glueKVCacheSuspend(c *kvCacheObj) error { return c.Suspend() }

func glueKVCacheResize(c *kvCacheObj, capacity, history C.int64_t) error {
	return c.Resize(int64(capacity), int64(history))
}

func glueKVCacheCommit(c *kvCacheObj, tokens []config.Token, isEnd C.bool) error {
	return c.Commit(tokens, bool(isEnd))
}

// glueKVCacheCommitBeamSearch: nil parents (NULL) keep the beams; a
// non-NULL empty array has the wrong length.
func glueKVCacheCommitBeamSearch(c *kvCacheObj, tokens []config.Token, parents []int, isEnd C.bool) error {
	return c.CommitBeamSearch(tokens, parents, bool(isEnd))
}

func glueKVCacheGetBeamWidth(c *kvCacheObj) (int, error) { return c.Core().BeamWidth(), nil }

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

func glueKVCacheGetStatus(c *kvCacheObj) (core.Status, error) { return c.Core().Status(), nil }

func glueKVCacheGetID(c *kvCacheObj) (uint64, error) { return c.Core().ID(), nil }

func glueKVCacheGetNumCommittedTokens(c *kvCacheObj) (int, error) {
	return c.Core().NumCommittedTokens(), nil
}

func glueKVCacheGetHistoryLength(c *kvCacheObj) (int, error) { return c.Core().HistoryLength(), nil }

func glueKVCacheGetCapacity(c *kvCacheObj) (int, error) { return c.Core().Capacity(), nil }

func glueKVCacheGetReusedTokens(c *kvCacheObj) (int, error) { return c.Core().ReusedTokens(), nil }

func glueKVCacheGetBasePageIndices(c *kvCacheObj, lg C.kvcm_layer_group_id) ([]int32, error) {
	return c.Core().BasePageIndices(layout.LayerGroupID(lg))
}

func glueKVCacheGetStats(c *kvCacheObj) (core.BlockStats, error) { return c.Core().Stats(), nil }

func glueKVCacheGetBeamBasePageIndices(c *kvCacheObj, lg C.kvcm_layer_group_id, beam C.int32_t) ([]int32, error) {
	return c.Core().BasePageIndicesOfBeam(layout.LayerGroupID(lg), int(beam))
}

func glueKVCacheGetSsmBlockBaseIndex(c *kvCacheObj, lg C.kvcm_layer_group_id) (int32, error) {
	return c.Core().SsmBlockBaseIndex(layout.LayerGroupID(lg))
}

func glueKVCacheGetReuseDiagnostics(c *kvCacheObj) (core.ReuseDiagnostics, error) {
	return c.Core().ReuseDiagnostics(), nil
}

func glueKVCacheCommitPendingStats(c *kvCacheObj) error {
	c.Core().CommitPendingStats()
	return nil
}

func glueKVCacheDiscardPendingStats(c *kvCacheObj) error {
	c.Core().DiscardPendingStats()
	return nil
}

func glueKVCacheGetCachedTokensByLevel(c *kvCacheObj) ([]int, error) {
	return c.Core().CachedTokensByLevel(), nil
}
