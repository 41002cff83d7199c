package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/layout"
)

// ---- Configuration ----

func cString(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// goBlockKey maps a kvcm_block_key to its algorithm; an unknown value stays
// unknown, for config validation to name.
func goBlockKey(k C.kvcm_block_key) blockhash.Algorithm {
	switch k {
	case C.KVCM_BLOCK_KEY_SHA256:
		return blockhash.SHA256
	case C.KVCM_BLOCK_KEY_XXH3:
		return blockhash.XXH3
	}
	return blockhash.Algorithm(k)
}

// goConfig copies a C configuration into a config.Config, naming the field
// of every NULL array.
func goConfig(c *C.kvcm__const_kvcm_manager_config) (config.Config, error) {
	cfg := config.Config{
		TokensPerBlock:     int(c.tokens_per_block),
		MaxUtilForResume:   float64(c.max_util_for_resume),
		EnablePartialReuse: bool(c.enable_partial_reuse),
		EnableStats:        bool(c.enable_stats),
	}
	if C.kvcm__has_manager_config_reuse_match_backoff(c) != 0 {
		cfg.ReuseMatchBackoff = int(c.reuse_match_backoff)
	}
	tiers, err := cArray(c.cache_tiers, c.num_cache_tiers, "config.cache_tiers")
	if err != nil {
		return cfg, err
	}
	for _, t := range tiers {
		cfg.CacheTiers = append(cfg.CacheTiers, config.CacheTierConfig{
			Kind: config.TierKind(t.kind), Quota: int64(t.quota), MaxQuota: int64(t.max_quota), Path: cString(t.path),
		})
	}
	layers, err := cArray(c.layers, c.num_layers, "config.layers")
	if err != nil {
		return cfg, err
	}
	for i, l := range layers {
		al := config.AttentionLayerConfig{
			LayerID: int32(l.layer_id), SlidingWindowSize: int(l.sliding_window_size), NumSinkTokens: int(l.num_sink_tokens),
		}
		bufs, err := cArray(l.buffers, l.num_buffers, fmt.Sprintf("config.layers[%d].buffers", i))
		if err != nil {
			return cfg, err
		}
		for j, b := range bufs {
			if b.role == nil {
				return cfg, argError(fmt.Sprintf("config.layers[%d].buffers[%d].role", i, j), "is NULL")
			}
			al.Buffers = append(al.Buffers, config.BufferConfig{Role: config.DataRole(C.GoString(b.role)), Size: int64(b.size)})
		}
		cfg.Layers = append(cfg.Layers, al)
	}
	ratios, err := cArray(c.initial_pool_ratio, c.num_initial_pool_ratio, "config.initial_pool_ratio")
	if err != nil {
		return cfg, err
	}
	if c.initial_pool_ratio != nil { // non-NULL and empty is set, and invalid
		cfg.InitialPoolRatio = make([]float64, 0, len(ratios))
	}
	for _, r := range ratios {
		cfg.InitialPoolRatio = append(cfg.InitialPoolRatio, float64(r))
	}
	if c.typical_step != nil {
		b, err := goBatch(c.typical_step, "config.typical_step")
		if err != nil {
			return cfg, err
		}
		cfg.TypicalStep = &b
	}
	cons, err := cArray(c.constraints, c.num_constraints, "config.constraints")
	if err != nil {
		return cfg, err
	}
	for i := range cons {
		b, err := goBatch(&cons[i], fmt.Sprintf("config.constraints[%d]", i))
		if err != nil {
			return cfg, err
		}
		cfg.Constraints = append(cfg.Constraints, b)
	}
	if C.kvcm__has_manager_config_shared_tier(c) != 0 && c.shared_tier != nil {
		cfg.CacheTiers = append(cfg.CacheTiers, config.Shared(goShared(c.shared_tier)))
	}
	if c.struct_size >= C.KVCM__MANAGER_CONFIG_SIZE_V2 {
		return cfg, goConfigV2(c, &cfg)
	}
	return cfg, nil
}

// goConfigV2 copies the fields ABI version 2 appended.
func goConfigV2(c *C.kvcm__const_kvcm_manager_config, cfg *config.Config) error {
	cfg.ReuseMatchBackoff = int(c.reuse_match_backoff)
	cfg.BlockKey = goBlockKey(c.block_key)
	cfg.TextOnly = bool(c.text_only)
	cfg.CommitMinSnapshot = bool(c.commit_min_snapshot)
	cfg.MaxSsmSlots = int64(c.max_ssm_slots)
	ssm, err := cArray(c.ssm_layers, c.num_ssm_layers, "config.ssm_layers")
	if err != nil {
		return err
	}
	for i, l := range ssm {
		sl := config.SsmLayerConfig{LayerID: int32(l.layer_id)}
		bufs, err := cArray(l.buffers, l.num_buffers, fmt.Sprintf("config.ssm_layers[%d].buffers", i))
		if err != nil {
			return err
		}
		for j, b := range bufs {
			if b.role == nil {
				return argError(fmt.Sprintf("config.ssm_layers[%d].buffers[%d].role", i, j), "is NULL")
			}
			sl.Buffers = append(sl.Buffers, config.BufferConfig{Role: config.DataRole(C.GoString(b.role)), Size: int64(b.size)})
		}
		cfg.SsmLayers = append(cfg.SsmLayers, sl)
	}
	cfg.RebalanceMinSampledKVCaches = int64(c.rebalance_min_sampled_kv_caches)
	cfg.RebalanceCooldownSecs = float64(c.rebalance_cooldown_secs)
	cfg.RebalanceTargetRatioUpdateInterval = int64(c.rebalance_target_ratio_update_interval)
	cfg.RebalanceRatioThreshold = float64(c.rebalance_ratio_threshold)
	cfg.RebalanceMovingAverageDecay = float64(c.rebalance_moving_average_decay)
	if c.swa_scratch_reuse {
		cfg.SwaScratchReuse = &config.SwaScratchReuseConfig{MaxRewindLen: int(c.swa_scratch_max_rewind_len)}
	}
	if c.disk_persistent {
		// On the last local tier, the disk tier when there is one:
		// config.Validate names any other as cache_tiers[i].persistent.
		for i := len(cfg.CacheTiers) - 1; i >= 0; i-- {
			if cfg.CacheTiers[i].Kind != config.SharedTier {
				cfg.CacheTiers[i].Persistent = true
				break
			}
		}
	}
	if cfg.TypicalStep != nil {
		cfg.TypicalStep.SystemPromptLength = int(c.typical_step_system_prompt_length)
	} else if c.typical_step_system_prompt_length != 0 {
		return argError("config.typical_step_system_prompt_length", "is %d without a typical_step", int64(c.typical_step_system_prompt_length))
	}
	lens, err := cArray(c.constraint_system_prompt_lengths, c.num_constraint_system_prompt_lengths, "config.constraint_system_prompt_lengths")
	if err != nil {
		return err
	}
	if len(lens) != 0 && len(lens) != len(cfg.Constraints) {
		return argError("config.num_constraint_system_prompt_lengths", "is %d, want 0 or num_constraints (%d)", len(lens), len(cfg.Constraints))
	}
	for i, n := range lens {
		cfg.Constraints[i].SystemPromptLength = int(n)
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

func goBatch(b *C.kvcm_batch_desc, name string) (config.BatchDesc, error) {
	reqs, err := cArray(b.requests, b.num_requests, name+".requests")
	if err != nil {
		return config.BatchDesc{}, err
	}
	var out config.BatchDesc
	for _, r := range reqs {
		out.Requests = append(out.Requests, config.RequestDesc{Capacity: int(r.capacity), HistoryLength: int(r.history_length)})
	}
	return out, nil
}

// cArray views a borrowed input array of n elements.
func cArray[T any](p *T, n C.size_t, name string) ([]T, error) {
	if p == nil && n != 0 {
		return nil, argError(name, "is NULL but its length is %d", uint64(n))
	}
	return cSlice(p, n, name)
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

func glueManagerGetTokensPerBlock(mgr *managerObj, out *C.int32_t) error {
	*out = C.int32_t(mgr.Core().TokensPerBlock())
	return nil
}

func glueManagerGetNumLayerGroups(mgr *managerObj, out *C.int32_t) error {
	*out = C.int32_t(mgr.Core().NumLayerGroups())
	return nil
}

func glueManagerGetNumLevels(mgr *managerObj, out *C.int32_t) error {
	*out = C.int32_t(len(mgr.Core().Layout().Levels))
	return nil
}

func glueManagerGetDeviceKind(mgr *managerObj, out *C.kvcm_device_kind) error {
	*out = C.KVCM_DEVICE_EMU
	if mgr.DeviceName() == backend.CUDA {
		*out = C.KVCM_DEVICE_CUDA
	}
	return nil
}

func glueManagerGetLayerGroupOf(mgr *managerObj, layerID C.int32_t, out *C.kvcm_layer_group_id) error {
	lg, err := mgr.Core().LayerGroupOf(int32(layerID))
	if err != nil {
		return err
	}
	*out = C.kvcm_layer_group_id(lg)
	return nil
}

func glueManagerGetBufferLocation(mgr *managerObj, layerID C.int32_t, role *C.kvcm__const_char, out *C.kvcm_buffer_location) error {
	loc, err := mgr.Core().Buffer(int32(layerID), config.DataRole(C.GoString(role)))
	if err != nil {
		return err
	}
	*out = C.kvcm_buffer_location{
		layer_group: C.kvcm_layer_group_id(loc.LifeCycle), pool: C.int32_t(loc.Pool), pool_base: C.kvcm_device_ptr(loc.PoolBase),
		scale: C.int64_t(loc.Scale), offset: C.int64_t(loc.Offset), bytes: C.int64_t(loc.Bytes),
	}
	return nil
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

func glueManagerGetQuota(mgr *managerObj, level C.kvcm_cache_level, out *C.int64_t) error {
	q, err := mgr.Core().Quota(layout.CacheLevel(level))
	if err != nil {
		return err
	}
	*out = C.int64_t(q)
	return nil
}

func glueManagerResizeLevel(mgr *managerObj, level C.kvcm_cache_level, quota C.int64_t) error {
	return mgr.Core().ResizeLevel(layout.CacheLevel(level), int64(quota))
}

// goScope copies a C reuse scope; hasLoRA makes lora_id an adapter id even
// when it is 0 (ABI version 2).
func goScope(s *C.kvcm__const_kvcm_reuse_scope, hasLoRA bool, name string) (blockhash.Scope, error) {
	if s.salt == nil && s.salt_len != 0 {
		return blockhash.Scope{}, argError(name+".salt", "is NULL but salt_len is %d", uint64(s.salt_len))
	}
	if s.salt_len > 1<<30 {
		return blockhash.Scope{}, argError(name+".salt_len", "%d is too large", uint64(s.salt_len))
	}
	var salt string
	if s.salt_len > 0 {
		salt = C.GoStringN(s.salt, C.int(s.salt_len))
	}
	return blockhash.Scope{LoRAID: int64(s.lora_id), HasLoRA: hasLoRA, Salt: salt}, nil
}

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

func glueManagerProbeReuse(mgr *managerObj, scope *C.kvcm__const_kvcm_reuse_scope, tokens *C.kvcm__const_kvcm_token, n C.size_t, out *C.int64_t) error {
	return glueManagerProbeReuseV2(mgr, scope, false, tokens, n, out)
}

func glueManagerProbeReuseV2(mgr *managerObj, scope *C.kvcm__const_kvcm_reuse_scope, hasLoRA C.bool, tokens *C.kvcm__const_kvcm_token, n C.size_t, out *C.int64_t) error {
	sc, err := goScope(scope, bool(hasLoRA), "scope")
	if err != nil {
		return err
	}
	ts, err := goTokens(tokens, n, "tokens")
	if err != nil {
		return err
	}
	reused, err := mgr.ProbeReuse(sc, ts)
	*out = C.int64_t(reused)
	return err
}

func glueManagerProbeFirstNewBlockKey(mgr *managerObj, scope *C.kvcm__const_kvcm_reuse_scope, hasLoRA C.bool, tokens *C.kvcm__const_kvcm_token, n C.size_t, key *C.uint64_t, found *C.bool) error {
	sc, err := goScope(scope, bool(hasLoRA), "scope")
	if err != nil {
		return err
	}
	ts, err := goTokens(tokens, n, "tokens")
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

func glueManagerGetNumOpenCaches(mgr *managerObj, out *C.size_t) error {
	if err := mgr.Open(); err != nil {
		return err
	}
	*out = C.size_t(mgr.Core().NumOpenCaches())
	return nil
}

// ---- Statistics ----

func cBlockStats(s core.BlockStats) C.kvcm_block_stats {
	return C.kvcm_block_stats{
		alloc_total_blocks: C.int64_t(s.AllocTotalBlocks), alloc_new_blocks: C.int64_t(s.AllocNewBlocks),
		reused_blocks: C.int64_t(s.ReusedBlocks), missed_blocks: C.int64_t(s.MissedBlocks),
		evictions: C.int64_t(s.Evictions), lost_pages: C.int64_t(s.LostPages), hit_rate: C.double(s.HitRate()),
	}
}

func glueManagerGetStats(mgr *managerObj, out *C.kvcm_block_stats) error {
	*out = cBlockStats(mgr.Core().Stats())
	return nil
}

func glueManagerGetAndResetIterationStats(mgr *managerObj, out *C.kvcm_block_stats) error {
	*out = cBlockStats(mgr.Core().GetAndResetIterationStats())
	return nil
}

// fill writes items into a caller buffer after checking its capacity.
func fill[T, E any](items []T, buf *E, capacity C.size_t, needed *C.size_t, conv func(T) E) error {
	*needed = C.size_t(len(items))
	if buf == nil && capacity == 0 {
		return nil
	}
	out, err := cSlice(buf, capacity, "capacity")
	if err != nil {
		return err
	}
	if uint64(capacity) < uint64(len(items)) {
		return errorf(codeBufferTooSmall, "need room for %d entries, got %d", len(items), uint64(capacity))
	}
	for i, it := range items {
		out[i] = conv(it)
	}
	return nil
}

func glueManagerGetStorageStats(mgr *managerObj, level C.kvcm_cache_level, stats *C.kvcm_pool_group_stats, capacity C.size_t, needed *C.size_t) error {
	st, err := mgr.Core().StorageStats(layout.CacheLevel(level))
	if err != nil {
		return err
	}
	return fill(st, stats, capacity, needed, func(s core.PoolGroupStats) C.kvcm_pool_group_stats {
		return C.kvcm_pool_group_stats{
			level: C.kvcm_cache_level(s.Level), tier: C.kvcm_tier_kind(s.Tier), index: C.kvcm_pool_group_index(s.Index),
			page_bytes: C.int64_t(s.PageBytes), total: C.int64_t(s.Total), free: C.int64_t(s.Free),
			evictable: C.int64_t(s.Evictable), available: C.int64_t(s.Available),
		}
	})
}

func glueManagerGetAndResetIterationPeakBlockStats(mgr *managerObj, level C.kvcm_cache_level, stats *C.kvcm_peak_block_stats, capacity C.size_t, needed *C.size_t) error {
	buf, err := cSlice(stats, capacity, "capacity")
	if err != nil {
		return err
	}
	peaks, n, err := mgr.GetAndResetIterationPeakBlockStats(layout.CacheLevel(level), len(buf))
	if err != nil {
		return err
	}
	if peaks == nil { // a size query or a buffer too small: nothing was reset
		peaks = make([]core.PeakBlockStats, n)
	}
	return fill(peaks, stats, capacity, needed, func(p core.PeakBlockStats) C.kvcm_peak_block_stats {
		return C.kvcm_peak_block_stats{index: C.kvcm_pool_group_index(p.Index), peak_used: C.int64_t(p.PeakUsed), total: C.int64_t(p.Total)}
	})
}

// fillReset is fill for a get-and-reset query of n entries: a size query or
// a buffer too small takes nothing (take resets what it returns).
func fillReset[T, E any](n int, buf *E, capacity C.size_t, needed *C.size_t, take func() []T, conv func(T) E) error {
	if buf == nil && capacity == 0 || uint64(capacity) < uint64(n) {
		return fill(make([]T, n), buf, capacity, needed, conv)
	}
	return fill(take(), buf, capacity, needed, conv)
}

func glueManagerGetAndResetLayerGroupIterationStats(mgr *managerObj, stats *C.kvcm_layer_group_iteration_stats, capacity C.size_t, needed *C.size_t) error {
	m := mgr.Core()
	lg := C.kvcm_layer_group_id(0)
	return fillReset(m.NumLayerGroups(), stats, capacity, needed, m.GetAndResetLayerGroupIterationStats,
		func(s core.LayerGroupStats) C.kvcm_layer_group_iteration_stats {
			out := C.kvcm_layer_group_iteration_stats{
				layer_group: lg, alloc_total_blocks: C.int64_t(s.AllocTotalBlocks), alloc_new_blocks: C.int64_t(s.AllocNewBlocks),
				reused_blocks: C.int64_t(s.ReusedBlocks), full_reused_blocks: C.int64_t(s.FullReusedBlocks),
				partial_reused_blocks: C.int64_t(s.PartialReusedBlocks), missed_blocks: C.int64_t(s.MissedBlocks),
				gen_alloc_blocks: C.int64_t(s.GenAllocBlocks),
				onboard_blocks:   C.int64_t(s.OnboardBlocks), onboard_bytes: C.int64_t(s.OnboardBytes),
				offload_blocks: C.int64_t(s.OffloadBlocks), offload_bytes: C.int64_t(s.OffloadBytes),
				intra_device_copy_blocks: C.int64_t(s.IntraDeviceCopyBlocks), intra_device_copy_bytes: C.int64_t(s.IntraDeviceCopyBytes),
				host_dropped_blocks: C.int64_t(s.HostDroppedBlocks), host_dropped_bytes: C.int64_t(s.HostDroppedBytes),
			}
			lg++
			return out
		})
}

func glueManagerGetAndResetSsmSnapshotIterationStats(mgr *managerObj, stats *C.kvcm_ssm_snapshot_iteration_stats, capacity C.size_t, needed *C.size_t) error {
	m := mgr.Core()
	type entry struct {
		lg layout.LayerGroupID
		s  core.SsmSnapshotStats
	}
	entries := func(byLG map[layout.LayerGroupID]core.SsmSnapshotStats) []entry {
		out := make([]entry, 0, len(byLG))
		for lg, s := range byLG {
			out = append(out, entry{lg, s})
		}
		slices.SortFunc(out, func(a, b entry) int { return cmp.Compare(a.lg, b.lg) })
		return out
	}
	return fillReset(len(m.SsmSnapshotIterationStats()), stats, capacity, needed,
		func() []entry { return entries(m.GetAndResetSsmSnapshotIterationStats()) },
		func(e entry) C.kvcm_ssm_snapshot_iteration_stats {
			return C.kvcm_ssm_snapshot_iteration_stats{
				layer_group: C.kvcm_layer_group_id(e.lg), snapshot_lookups: C.int64_t(e.s.Lookups),
				snapshot_hits: C.int64_t(e.s.Hits), snapshot_misses: C.int64_t(e.s.Misses),
				reused_tokens: C.int64_t(e.s.ReusedTokens), unreused_tokens: C.int64_t(e.s.UnreusedTokens),
				aligned_snapshot_hits: C.int64_t(e.s.AlignedHits), unaligned_snapshot_hits: C.int64_t(e.s.UnalignedHits),
			}
		})
}

func glueManagerGetAndResetIterationReusedBlocksByLevel(mgr *managerObj, rows *C.kvcm_reused_blocks_at_level, capacity C.size_t, needed *C.size_t) error {
	m := mgr.Core()
	type row struct {
		lg, level   int
		full, parts int64
	}
	take := func() []row {
		var out []row
		for lg, r := range m.GetAndResetIterationReusedBlocksByLevel() {
			for level := range r.Full {
				out = append(out, row{lg, level, r.Full[level], r.Partial[level]})
			}
		}
		return out
	}
	n := m.NumLayerGroups() * len(m.Layout().Levels)
	return fillReset(n, rows, capacity, needed, take, func(r row) C.kvcm_reused_blocks_at_level {
		return C.kvcm_reused_blocks_at_level{layer_group: C.kvcm_layer_group_id(r.lg), level: C.kvcm_cache_level(r.level),
			full_blocks: C.int64_t(r.full), partial_blocks: C.int64_t(r.parts)}
	})
}

func glueManagerGetAndResetIterationCachedTokensByLevel(mgr *managerObj, tokens *C.int64_t, capacity C.size_t, needed *C.size_t) error {
	m := mgr.Core()
	return fillReset(len(m.Layout().Levels), tokens, capacity, needed, m.GetAndResetIterationCachedTokensByLevel,
		func(n int64) C.int64_t { return C.int64_t(n) })
}

func glueManagerGetAndResetIterationPoolGroupPeakBlockStats(mgr *managerObj, level C.kvcm_cache_level, stats *C.kvcm_pool_group_peak_block_stats, capacity C.size_t, needed *C.size_t) error {
	buf, err := cSlice(stats, capacity, "capacity")
	if err != nil {
		return err
	}
	peaks, n, err := mgr.GetAndResetIterationPeakBlockStats(layout.CacheLevel(level), len(buf))
	if err != nil {
		return err
	}
	if peaks == nil { // a size query or a buffer too small: nothing was reset
		peaks = make([]core.PeakBlockStats, n)
	}
	return fill(peaks, stats, capacity, needed, func(p core.PeakBlockStats) C.kvcm_pool_group_peak_block_stats {
		return C.kvcm_pool_group_peak_block_stats{index: C.kvcm_pool_group_index(p.Index), available: C.int64_t(p.Available),
			unavailable: C.int64_t(p.Unavailable), evictable: C.int64_t(p.Evictable)}
	})
}

func glueManagerGetMigrationStats(mgr *managerObj, stats *C.kvcm_migration_stats, capacity C.size_t, needed *C.size_t) error {
	ms, err := mgr.MigrationStats()
	if err != nil {
		return err
	}
	return fill(core.Paths(), stats, capacity, needed, func(p core.Path) C.kvcm_migration_stats {
		c := ms[p]
		return C.kvcm_migration_stats{path: C.kvcm_migration_path(p), pages: C.int64_t(c.Pages), bytes: C.int64_t(c.Bytes)}
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
		evs[i] = C.kvcm_cache_event{
			seq: C.uint64_t(ev.Seq), key: C.uint64_t(ev.Key), parent: C.uint64_t(ev.Parent),
			kind: C.kvcm_event_kind(ev.Kind), layer_group: C.kvcm_layer_group_id(ev.LayerGroup),
			level: C.kvcm_cache_level(ev.Level), num_tokens: C.size_t(len(ev.Tokens)),
			cache_id: C.uint64_t(ev.CacheID),
		}
		if len(ev.Tokens) > 0 {
			evs[i].tokens = &toks[ntok]
		}
		for _, t := range ev.Tokens {
			toks[ntok] = C.kvcm_token(t)
			ntok++
		}
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
		evs[i] = C.kvcm_block_event{
			seq: C.uint64_t(ev.Seq), key: C.uint64_t(ev.Key), parent: C.uint64_t(ev.Parent), cache_id: C.uint64_t(ev.CacheID),
			kind: C.kvcm_event_kind(ev.Kind), layer_group: C.kvcm_layer_group_id(ev.LayerGroup),
			level: C.kvcm_cache_level(ev.Level), old_level: C.kvcm_cache_level(ev.OldLevel),
			priority: C.int32_t(ev.Priority), old_priority: C.int32_t(ev.OldPriority), num_tokens: C.size_t(len(ev.Tokens)),
		}
		if len(ev.Tokens) > 0 {
			evs[i].tokens = &toks[ntok]
		}
		if onDigest != nil {
			for j := range ev.Digests {
				onDigest(ntok+ev.Digests[j].Pos, &ev.Digests[j].Digest)
			}
		}
		for _, t := range ev.Tokens {
			toks[ntok] = C.kvcm_token(t)
			ntok++
		}
	}
	*numEvents, *numTokens = C.size_t(len(got)), C.size_t(ntok)
	if dropped != nil {
		*dropped = C.uint64_t(d)
	}
	return nil
}

// cSlice views a caller's buffer of n elements.
func cSlice[T any](p *T, n C.size_t, name string) ([]T, error) {
	if n > abimodel.MaxElems/C.size_t(max(unsafe.Sizeof(*p), 1)) {
		return nil, argError(name, "%d is too large", uint64(n))
	}
	if p == nil || n == 0 {
		return nil, nil
	}
	return unsafe.Slice(p, int(n)), nil
}

// ---- Streams and memory ----

func glueManagerCreateStream(mgr *managerObj, out *C.kvcm_stream) error {
	s, err := mgr.CreateStream()
	if err != nil {
		return err
	}
	*out = C.kvcm_stream(s.Handle())
	return nil
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

func glueManagerAllocMemory(mgr *managerObj, kind C.kvcm_memory_kind, size C.uint64_t, out *C.kvcm_device_ptr) error {
	k, err := goMemoryKind(kind)
	if err != nil {
		return err
	}
	p, err := mgr.AllocMemory(k, uint64(size))
	if err != nil {
		return err
	}
	*out = C.kvcm_device_ptr(p)
	return nil
}

func glueManagerFreeMemory(mgr *managerObj, ptr C.kvcm_device_ptr) error {
	return mgr.FreeMemory(device.Ptr(ptr))
}
