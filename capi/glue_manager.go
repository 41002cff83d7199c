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
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
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

// ---- Queries ----

func glueManagerGetTokensPerBlock(mgr *managerObj) (int, error) {
	return mgr.Core().TokensPerBlock(), nil
}

func glueManagerGetNumLayerGroups(mgr *managerObj) (int, error) {
	return mgr.Core().NumLayerGroups(), nil
}

func glueManagerGetNumLevels(mgr *managerObj) (int, error) {
	return len(mgr.Core().Layout().Levels), nil
}

func glueManagerGetDeviceKind(mgr *managerObj) (abimodel.DeviceKind, error) {
	return mgr.DeviceKind(), nil
}

func glueManagerGetLayerGroupOf(mgr *managerObj, layerID C.int32_t) (layout.LayerGroupID, error) {
	return mgr.Core().LayerGroupOf(int32(layerID))
}

func glueManagerGetBufferLocation(mgr *managerObj, layerID C.int32_t, role config.DataRole) (core.BufferLocation, error) {
	return mgr.Core().Buffer(int32(layerID), role)
}

func glueManagerGetPoolGroupDescs(mgr *managerObj, level C.kvcm_cache_level, descs *C.kvcm_pool_group_desc, descsCap C.size_t,
	lifeCycles *C.kvcm_layer_group_id, lifeCyclesCap C.size_t, pools *C.kvcm_pool_desc, poolsCap C.size_t,
	numDescs, numLifeCycles, numPools *C.size_t) error {
	ds, err := mgr.PoolGroupDescs(layout.CacheLevel(level))
	if err != nil {
		return err
	}
	var nlc, np int
	for _, d := range ds {
		nlc += len(d.LifeCycles)
		np += len(d.Pools)
	}
	*numDescs, *numLifeCycles, *numPools = C.size_t(len(ds)), C.size_t(nlc), C.size_t(np)
	if descs == nil && lifeCycles == nil && pools == nil && descsCap == 0 && lifeCyclesCap == 0 && poolsCap == 0 {
		return nil
	}
	cd, err := cSlice(descs, descsCap, "descs_cap")
	if err != nil {
		return err
	}
	lcs, err := cSlice(lifeCycles, lifeCyclesCap, "life_cycles_cap")
	if err != nil {
		return err
	}
	ps, err := cSlice(pools, poolsCap, "pools_cap")
	if err != nil {
		return err
	}
	if uint64(descsCap) < uint64(len(ds)) || uint64(lifeCyclesCap) < uint64(nlc) || uint64(poolsCap) < uint64(np) {
		return errorf(codeBufferTooSmall, "need %d descriptors, %d layer groups and %d pools; got room for %d, %d and %d",
			len(ds), nlc, np, uint64(descsCap), uint64(lifeCyclesCap), uint64(poolsCap))
	}
	fillPoolGroupDescs(ds, cd, lcs, ps)
	return nil
}

func glueManagerGetQuota(mgr *managerObj, level C.kvcm_cache_level) (int64, error) {
	return mgr.Core().Quota(layout.CacheLevel(level))
}

func glueManagerResizeLevel(mgr *managerObj, level C.kvcm_cache_level, quota C.int64_t) error {
	return mgr.Core().ResizeLevel(layout.CacheLevel(level), int64(quota))
}

func glueManagerProbeReuse(mgr *managerObj, scope blockhash.Scope, tokens []config.Token) (int, error) {
	return mgr.ProbeReuse(scope, tokens)
}

func glueManagerProbeReuseV2(mgr *managerObj, scope blockhash.Scope, hasLoRA C.bool, tokens []config.Token) (int, error) {
	scope.HasLoRA = bool(hasLoRA)
	return mgr.ProbeReuse(scope, tokens)
}

func glueManagerProbeReusePages(mgr *managerObj, scope blockhash.Scope, hasLoRA C.bool, tokens []config.Token, lg C.kvcm_layer_group_id, partial C.bool) ([]core.ReusePage, error) {
	scope.HasLoRA = bool(hasLoRA)
	_, pages, err := mgr.Core().ReusePages(scope, tokens, layout.LayerGroupID(lg), bool(partial))
	return pages, err
}

func glueManagerProbeFirstNewBlockKey(mgr *managerObj, sc blockhash.Scope, hasLoRA C.bool, ts []config.Token, key *C.uint64_t, found *C.bool) error {
	sc.HasLoRA = bool(hasLoRA)
	if err := mgr.Open(); err != nil {
		return err
	}
	k, ok := mgr.Core().ProbeFirstNewBlockKey(sc, ts)
	*key, *found = C.uint64_t(k), C.bool(ok)
	return nil
}

func glueManagerSetBlockPriorities(mgr *managerObj, sc blockhash.Scope, hasLoRA C.bool, keys []blockhash.Key, prs []int) (int, error) {
	sc.HasLoRA = bool(hasLoRA)
	return mgr.Core().SetBlockPriorities(sc, keys, prs)
}

func glueManagerClearReusableBlocks(mgr *managerObj) error { return mgr.Core().ClearReusableBlocks() }

func glueManagerGetNumOpenCaches(mgr *managerObj) (int, error) {
	if err := mgr.Open(); err != nil {
		return 0, err
	}
	return mgr.Core().NumOpenCaches(), nil
}

// ---- Statistics ----

func glueManagerGetStats(mgr *managerObj) (core.BlockStats, error) { return mgr.Core().Stats(), nil }

func glueManagerGetAndResetIterationStats(mgr *managerObj) (core.BlockStats, error) {
	return mgr.Core().GetAndResetIterationStats(), nil
}

func glueManagerGetStorageStats(mgr *managerObj, level C.kvcm_cache_level) ([]core.PoolGroupStats, error) {
	return mgr.Core().StorageStats(layout.CacheLevel(level))
}

func glueManagerGetAndResetIterationPeakBlockStats(mgr *managerObj, level C.kvcm_cache_level, room int) ([]core.PeakBlockStats, int, error) {
	return mgr.GetAndResetIterationPeakBlockStats(layout.CacheLevel(level), room)
}

func glueManagerGetAndResetLayerGroupIterationStats(mgr *managerObj, room int) ([]abimodel.LayerGroupIterationStats, int, error) {
	return mgr.GetAndResetLayerGroupIterationStats(room)
}

func glueManagerGetAndResetSsmSnapshotIterationStats(mgr *managerObj, room int) ([]abimodel.SsmSnapshotIterationStats, int, error) {
	return mgr.GetAndResetSsmSnapshotIterationStats(room)
}

func glueManagerGetAndResetIterationReusedBlocksByLevel(mgr *managerObj, room int) ([]abimodel.ReusedBlocksAtLevel, int, error) {
	return mgr.GetAndResetIterationReusedBlocksByLevel(room)
}

func glueManagerGetAndResetIterationCachedTokensByLevel(mgr *managerObj, room int) ([]int64, int, error) {
	return mgr.GetAndResetIterationCachedTokensByLevel(room)
}

func glueManagerGetAndResetIterationPoolGroupPeakBlockStats(mgr *managerObj, level C.kvcm_cache_level, room int) ([]core.PeakBlockStats, int, error) {
	return mgr.GetAndResetIterationPeakBlockStats(layout.CacheLevel(level), room)
}

func glueManagerGetMigrationStats(mgr *managerObj, stats *C.kvcm_migration_stats, capacity C.size_t, needed *C.size_t) error {
	ms, err := mgr.MigrationStats()
	if err != nil {
		return err
	}
	return fill(core.Paths(), stats, capacity, needed, func(p core.Path) C.kvcm_migration_stats {
		out := toCMigrationStats(ms[p])
		out.path = C.kvcm_migration_path(p)
		return out
	})
}

func glueConfigValidate(mc abimodel.ManagerConfig) error {
	cfg, opts, err := mc.Resolve()
	if err != nil {
		return err
	}
	return abimodel.Validate(cfg, opts)
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

// ---- Streams and memory ----

func glueManagerCreateStream(mgr *managerObj) (uintptr, error) {
	s, err := mgr.CreateStream()
	if err != nil {
		return 0, err
	}
	return s.Handle(), nil
}

func glueManagerDestroyStream(mgr *managerObj, stream C.kvcm_stream) error {
	return mgr.DestroyStream(uintptr(stream))
}

func goMemoryKind(kind C.kvcm_memory_kind) (device.MemoryKind, error) {
	switch kind {
	case C.KVCM_MEMORY_DEVICE:
		return device.DeviceMemory, nil
	case C.KVCM_MEMORY_HOST_MAPPED:
		return device.HostMapped, nil
	}
	return 0, argError("kind", "unknown memory kind %d", int32(kind))
}

func glueManagerAllocMemory(mgr *managerObj, kind C.kvcm_memory_kind, size C.uint64_t) (device.Ptr, error) {
	k, err := goMemoryKind(kind)
	if err != nil {
		return 0, err
	}
	return mgr.AllocMemory(k, uint64(size))
}

func glueManagerFreeMemory(mgr *managerObj, ptr C.kvcm_device_ptr) error {
	return mgr.FreeMemory(device.Ptr(ptr))
}

// ---- Shared tier ----

func glueManagerGetSharedLevel(mgr *managerObj) (layout.CacheLevel, error) { return mgr.SharedLevel() }

func glueManagerGetSharedStats(mgr *managerObj) (core.SharedStats, error) { return mgr.SharedStats() }

func glueManagerFlushShared(mgr *managerObj, timeoutMs C.int64_t) (bool, error) {
	return mgr.FlushShared(int64(timeoutMs))
}
