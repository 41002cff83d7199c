package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/layout"
)

// ---- Configuration ----

// goConfig copies a C configuration into a config.Config: fromCManagerConfig
// converts the fields that map one to one, this the rest.
func goConfig(c *C.kvcm__const_kvcm_manager_config) (config.Config, error) {
	cc := (*C.kvcm_manager_config)(c)
	cfg, err := fromCManagerConfig(cc, "config")
	if err != nil {
		return cfg, err
	}
	if C.kvcm__has_manager_config_shared_tier(cc) != 0 && c.shared_tier != nil {
		cfg.CacheTiers = append(cfg.CacheTiers, config.Shared(goShared(c.shared_tier)))
	}
	if C.kvcm__has_manager_config_swa_scratch_reuse(cc) != 0 && c.swa_scratch_reuse {
		cfg.SwaScratchReuse = &config.SwaScratchReuseConfig{}
		if C.kvcm__has_manager_config_swa_scratch_max_rewind_len(cc) != 0 {
			cfg.SwaScratchReuse.MaxRewindLen = int(c.swa_scratch_max_rewind_len)
		}
	}
	if C.kvcm__has_manager_config_disk_persistent(cc) != 0 && c.disk_persistent {
		// On the last local tier, the disk tier when there is one:
		// config.Validate names any other as cache_tiers[i].persistent.
		for i := len(cfg.CacheTiers) - 1; i >= 0; i-- {
			if cfg.CacheTiers[i].Kind != config.SharedTier {
				cfg.CacheTiers[i].Persistent = true
				break
			}
		}
	}
	if C.kvcm__has_manager_config_typical_step_system_prompt_length(cc) != 0 {
		if cfg.TypicalStep != nil {
			cfg.TypicalStep.SystemPromptLength = int(c.typical_step_system_prompt_length)
		} else if c.typical_step_system_prompt_length != 0 {
			return cfg, argError("config.typical_step_system_prompt_length", "is %d without a typical_step", int64(c.typical_step_system_prompt_length))
		}
	}
	if err := goBufferOverrides(cc, &cfg); err != nil {
		return cfg, err
	}
	if C.kvcm__has_manager_config_num_constraint_system_prompt_lengths(cc) == 0 {
		return cfg, nil
	}
	lens, err := cArray(c.constraint_system_prompt_lengths, c.num_constraint_system_prompt_lengths, "config.constraint_system_prompt_lengths")
	if err != nil {
		return cfg, err
	}
	if len(lens) != 0 && len(lens) != len(cfg.Constraints) {
		return cfg, argError("config.num_constraint_system_prompt_lengths", "is %d, want 0 or num_constraints (%d)", len(lens), len(cfg.Constraints))
	}
	for i, n := range lens {
		cfg.Constraints[i].SystemPromptLength = int(n)
	}
	return cfg, nil
}

// goBufferOverrides sets each buffer's tokens_per_block_override from
// buffer_tokens_per_block_overrides (one per buffer of every attention layer,
// in order, or none).
func goBufferOverrides(c *C.kvcm_manager_config, cfg *config.Config) error {
	if C.kvcm__has_manager_config_num_buffer_tokens_per_block_overrides(c) == 0 {
		return nil
	}
	overrides, err := cArray(c.buffer_tokens_per_block_overrides, c.num_buffer_tokens_per_block_overrides, "config.buffer_tokens_per_block_overrides")
	if err != nil || len(overrides) == 0 {
		return err
	}
	var bufs []*config.BufferConfig
	for i := range cfg.Layers {
		for j := range cfg.Layers[i].Buffers {
			bufs = append(bufs, &cfg.Layers[i].Buffers[j])
		}
	}
	if len(overrides) != len(bufs) {
		return argError("config.num_buffer_tokens_per_block_overrides", "is %d, want 0 or the number of buffers of all layers (%d)", len(overrides), len(bufs))
	}
	for i, o := range overrides {
		bufs[i].TokensPerBlockOverride = int(o)
	}
	return nil
}

// goShared copies a shared tier's settings; config.Validate checks them,
// naming cache_tiers[i].<field> (the shared tier follows the local tiers).
func goShared(s *C.kvcm_shared_tier_config) config.SharedCacheTierConfig {
	var addrs []string
	if a := cString(s.addresses); a != "" {
		addrs = strings.Split(a, ",")
	}
	ms := func(v C.int64_t) time.Duration { // saturating, so a huge value stays positive
		if int64(v) > math.MaxInt64/int64(time.Millisecond) {
			return math.MaxInt64
		}
		return time.Duration(v) * time.Millisecond
	}
	return config.SharedCacheTierConfig{
		Addresses:   addrs,
		Namespace:   cString(s.key_namespace),
		TTL:         ms(s.ttl_ms),
		DialTimeout: ms(s.dial_timeout_ms),
		CallTimeout: ms(s.call_timeout_ms),
		QueueBytes:  int64(s.queue_bytes),
		WritePolicy: config.SharedWritePolicy(s.write_policy),
	}
}

// ---- Create and destroy ----

// goDevice converts the device selection of a C configuration.
func goDevice(kind C.kvcm_device_kind) (string, error) {
	switch kind {
	case C.KVCM_DEVICE_AUTO:
		return backend.Auto, nil
	case C.KVCM_DEVICE_EMU:
		return backend.Emu, nil
	case C.KVCM_DEVICE_CUDA:
		return backend.CUDA, nil
	}
	return "", argError("config.device", "unknown device kind %d", int32(kind))
}

// goOptions converts what a C configuration holds besides config.Config.
func goOptions(c *C.kvcm__const_kvcm_manager_config) (abimodel.Options, error) {
	dev, err := goDevice(c.device)
	return abimodel.Options{Device: dev, DeviceOrdinal: int(c.device_ordinal), EventQueueCapacity: int(c.event_queue_capacity)}, err
}

func glueManagerCreate(cfgC *C.kvcm__const_kvcm_manager_config, codecArg *coldPageCodecArg, out *C.kvcm_manager) error {
	if codecArg.err != nil {
		return codecArg.err
	}
	cfg, err := goConfig(cfgC)
	if err != nil {
		return err
	}
	opts, err := goOptions(cfgC)
	if err != nil {
		return err
	}
	opts.Codec = codecArg.owned // consumed by New, also on failure
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

func glueManagerGetDeviceKind(mgr *managerObj) (C.kvcm_device_kind, error) {
	if mgr.DeviceName() == backend.CUDA {
		return C.KVCM_DEVICE_CUDA, nil
	}
	return C.KVCM_DEVICE_EMU, nil
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

// goScope copies a C reuse scope; hasLoRA makes lora_id an adapter id even
// when it is 0 (ABI version 2).
func goScope(s *C.kvcm__const_kvcm_reuse_scope, hasLoRA bool, name string) (blockhash.Scope, error) {
	sc, err := fromCReuseScope((*C.kvcm_reuse_scope)(s), name)
	sc.HasLoRA = hasLoRA
	return sc, err
}

func glueManagerProbeReuse(mgr *managerObj, scope *C.kvcm__const_kvcm_reuse_scope, tokens []config.Token) (int, error) {
	return glueManagerProbeReuseV2(mgr, scope, false, tokens)
}

func glueManagerProbeReuseV2(mgr *managerObj, scope *C.kvcm__const_kvcm_reuse_scope, hasLoRA C.bool, tokens []config.Token) (int, error) {
	sc, err := goScope(scope, bool(hasLoRA), "scope")
	if err != nil {
		return 0, err
	}
	return mgr.ProbeReuse(sc, tokens)
}

func glueManagerProbeFirstNewBlockKey(mgr *managerObj, scope *C.kvcm__const_kvcm_reuse_scope, hasLoRA C.bool, ts []config.Token, key *C.uint64_t, found *C.bool) error {
	sc, err := goScope(scope, bool(hasLoRA), "scope")
	if err != nil {
		return err
	}
	*key, *found = 0, false
	if err := mgr.Open(); err != nil {
		return err
	}
	k, ok := mgr.Core().ProbeFirstNewBlockKey(sc, ts)
	*key, *found = C.uint64_t(k), C.bool(ok)
	return nil
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

func glueConfigValidate(cfgC *C.kvcm__const_kvcm_manager_config) error {
	cfg, err := goConfig(cfgC)
	if err != nil {
		return err
	}
	opts, err := goOptions(cfgC)
	if err != nil {
		return err
	}
	return abimodel.Validate(cfg, opts)
}

// ---- Events ----

func glueManagerDrainEvents(mgr *managerObj, events *C.kvcm_cache_event, eventsCap C.size_t, tokens *C.kvcm_token, tokensCap C.size_t,
	numEvents *C.size_t, numTokens *C.size_t, dropped *C.uint64_t) error {
	evs, err := cSlice(events, eventsCap, "events_cap")
	if err != nil {
		return err
	}
	toks, err := cSlice(tokens, tokensCap, "tokens_cap")
	if err != nil {
		return err
	}
	// Priority updates have no kvcm_cache_event form: skipped, draining
	// on while a drain brought only those.
	var got []core.CacheEvent
	var d uint64
	for {
		all, dd, need := mgr.Events().Drain(len(evs), len(toks))
		d += dd
		if need > 0 {
			*numTokens = C.size_t(need)
			return errorf(codeBufferTooSmall, "the oldest event has %d tokens; tokens_cap is %d", need, uint64(tokensCap))
		}
		got = slices.DeleteFunc(all, func(ev core.CacheEvent) bool { return ev.Kind == core.BlockPriorityUpdated })
		if len(got) > 0 || len(all) == 0 {
			break
		}
	}
	ntok := 0
	for i, ev := range got {
		evs[i] = toCCacheEvent(ev)
		evs[i].tokens, evs[i].num_tokens = eventTokens(ev.Tokens, toks, &ntok)
	}
	*numEvents, *numTokens = C.size_t(len(got)), C.size_t(ntok)
	if dropped != nil {
		*dropped = C.uint64_t(d)
	}
	return nil
}

func glueManagerDrainBlockEvents(mgr *managerObj, events *C.kvcm_block_event, eventsCap C.size_t, tokens *C.kvcm_token, tokensCap C.size_t,
	numEvents *C.size_t, numTokens *C.size_t, dropped *C.uint64_t) error {
	return drainBlockEvents(mgr, events, eventsCap, tokens, tokensCap, nil, numEvents, numTokens, dropped)
}

// drainBlockEvents writes block events; each stored block's digest tokens
// go to onDigest (nil: dropped), with their positions in the tokens buffer.
func drainBlockEvents(mgr *managerObj, events *C.kvcm_block_event, eventsCap C.size_t, tokens *C.kvcm_token, tokensCap C.size_t,
	onDigest func(pos int, d *blockhash.Digest), numEvents *C.size_t, numTokens *C.size_t, dropped *C.uint64_t) error {
	evs, err := cSlice(events, eventsCap, "events_cap")
	if err != nil {
		return err
	}
	toks, err := cSlice(tokens, tokensCap, "tokens_cap")
	if err != nil {
		return err
	}
	got, d, need := mgr.Events().Drain(len(evs), len(toks))
	if need > 0 {
		*numTokens = C.size_t(need)
		return errorf(codeBufferTooSmall, "the oldest event has %d tokens; tokens_cap is %d", need, uint64(tokensCap))
	}
	ntok := 0
	for i, ev := range got {
		evs[i] = toCBlockEvent(ev)
		if onDigest != nil {
			for j := range ev.Digests {
				onDigest(ntok+ev.Digests[j].Pos, &ev.Digests[j].Digest)
			}
		}
		evs[i].tokens, evs[i].num_tokens = eventTokens(ev.Tokens, toks, &ntok)
	}
	*numEvents, *numTokens = C.size_t(len(got)), C.size_t(ntok)
	if dropped != nil {
		*dropped = C.uint64_t(d)
	}
	return nil
}

// eventTokens copies an event's tokens to toks at *ntok, advancing it, and
// returns where they are (NULL for none) and their number.
func eventTokens(ts []config.Token, toks []C.kvcm_token, ntok *int) (*C.kvcm_token, C.size_t) {
	if len(ts) == 0 {
		return nil, 0
	}
	p := &toks[*ntok]
	for _, t := range ts {
		toks[*ntok] = C.kvcm_token(t)
		*ntok++
	}
	return p, C.size_t(len(ts))
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
