package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"fmt"
	"math"
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

// goConfig copies a C configuration into a config.Config, naming the field
// of every NULL array.
func goConfig(c *C.kvcm__const_kvcm_manager_config) (config.Config, error) {
	cfg := config.Config{
		TokensPerBlock:     int(c.tokens_per_block),
		MaxUtilForResume:   float64(c.max_util_for_resume),
		EnablePartialReuse: bool(c.enable_partial_reuse),
		EnableStats:        bool(c.enable_stats),
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
	return cfg, nil
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

func goScope(s *C.kvcm__const_kvcm_reuse_scope, name string) (blockhash.Scope, error) {
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
	return blockhash.Scope{LoRAID: int64(s.lora_id), Salt: salt}, nil
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
	sc, err := goScope(scope, "scope")
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
	got, d, need := mgr.Events().Drain(len(evs), len(toks))
	if need > 0 {
		*numTokens = C.size_t(need)
		return errorf(codeBufferTooSmall, "the oldest event has %d tokens; tokens_cap is %d", need, uint64(tokensCap))
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
