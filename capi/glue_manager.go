package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// managerObj is what a kvcm_manager handle refers to.
type managerObj struct {
	handle  uint64
	m       *core.Manager
	dev     device.Device
	devKind C.kvcm_device_kind
	events  *eventQueue

	mu       sync.Mutex // guards caches, streams, mem, gone, attached and the cache handles' deletion
	caches   map[uint64]*kvCacheObj
	closing  sync.WaitGroup // kvcm_kv_cache_close calls in flight (Add under mu)
	streams  map[uintptr]device.Stream
	mem      map[device.Ptr]device.Memory
	gone     bool
	attached *cpObj // the CP index new caches notify (kvcm_manager_attach_cp)
	closed   atomic.Bool

	lmu       sync.Mutex // guards listeners, nextL, emitted
	listeners map[int]core.EventListener
	nextL     int
	emitted   bool
}

// onEvent is the manager's event listener (called with the manager's lock
// held): the extra listeners (manager-backed CP indexes), then the queue.
func (mgr *managerObj) onEvent(e core.CacheEvent) {
	mgr.lmu.Lock()
	mgr.emitted = true
	for _, l := range mgr.listeners {
		l(e)
	}
	mgr.lmu.Unlock()
	mgr.events.push(e)
}

// listen adds a listener that must see every event of the manager: it fails
// once the manager has emitted one. The returned func removes it.
func (mgr *managerObj) listen(l core.EventListener) (func(), error) {
	mgr.lmu.Lock()
	defer mgr.lmu.Unlock()
	if mgr.closed.Load() {
		return nil, errorf(codeInvalidHandle, "manager is being destroyed")
	}
	if mgr.emitted {
		return nil, errorf(codeInvalidState, "the manager has already stored blocks: create the manager-backed index before the first commit")
	}
	if mgr.listeners == nil {
		mgr.listeners = map[int]core.EventListener{}
	}
	id := mgr.nextL
	mgr.nextL++
	mgr.listeners[id] = l
	return func() {
		mgr.lmu.Lock()
		delete(mgr.listeners, id)
		mgr.lmu.Unlock()
	}, nil
}

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
	return cfg, nil
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

func glueManagerCreate(cfgC *C.kvcm__const_kvcm_manager_config, codecArg *coldPageCodecArg, out *C.kvcm_manager) error {
	if codecArg.err != nil {
		return codecArg.err
	}
	cfg, err := goConfig(cfgC)
	if err != nil {
		return err
	}
	capacity := int(cfgC.event_queue_capacity)
	if capacity == 0 {
		capacity = C.KVCM_DEFAULT_EVENT_QUEUE_CAPACITY
	}
	dev, kind, err := openDevice(cfgC.device, cfgC.device_ordinal)
	if err != nil {
		return err
	}
	obj := &managerObj{
		dev: dev, devKind: kind, events: newEventQueue(capacity),
		caches: map[uint64]*kvCacheObj{}, streams: map[uintptr]device.Stream{}, mem: map[device.Ptr]device.Memory{},
	}
	// NewManager takes the codec as its first act and destroys it on failure.
	m, err := core.NewManager(cfg, core.WithDevice(dev), core.WithColdPageCodec(codecArg.owned), core.WithEventListener(obj.onEvent))
	if err != nil {
		dev.Close()
		return err
	}
	obj.m = m
	registerDevice(dev)
	obj.handle = newHandle(obj)
	*out = C.kvcm_manager(obj.handle)
	return nil
}

func glueManagerDestroy(mgr *managerObj) error {
	if !deleteHandle(mgr.handle) {
		return errorf(codeInvalidHandle, "manager: %#x was destroyed concurrently", mgr.handle)
	}
	mgr.closed.Store(true)
	mgr.mu.Lock()
	mgr.gone = true
	attached := mgr.attached
	mgr.attached = nil
	// A cache's handle is deleted under mu, here and in glueKVCacheClose, so
	// each open cache is closed by exactly one of them.
	var caches []*kvCacheObj
	for _, c := range mgr.caches {
		if deleteHandle(c.handle) {
			caches = append(caches, c)
		}
	}
	streams := slices.Collect(maps.Values(mgr.streams))
	mems := slices.Collect(maps.Values(mgr.mem))
	clear(mgr.caches)
	clear(mgr.streams)
	clear(mgr.mem)
	mgr.mu.Unlock()
	var errs []error
	slices.SortFunc(caches, func(a, b *kvCacheObj) int { return cmp.Compare(a.handle, b.handle) })
	for _, c := range caches {
		if err := c.close(); err != nil {
			errs = append(errs, fmt.Errorf("close cache %d: %w", c.c.ID(), err))
		}
	}
	// Caches a concurrent kvcm_kv_cache_close took are closed before the
	// manager is.
	mgr.closing.Wait()
	if attached != nil {
		attached.release()
	}
	// Work the engine (or a codec) queued on the manager's streams runs
	// before the codec is destroyed and the device closed.
	for _, s := range streams {
		s.Synchronize()
	}
	if err := mgr.m.Close(); err != nil {
		errs = append(errs, err)
	}
	for _, s := range streams {
		s.Close()
	}
	for _, mem := range mems {
		mem.Free()
	}
	unregisterDevice(mgr.dev)
	mgr.dev.Close()
	return errors.Join(errs...)
}

// ---- Queries ----

func glueManagerGetTokensPerBlock(mgr *managerObj, out *C.int32_t) error {
	*out = C.int32_t(mgr.m.TokensPerBlock())
	return nil
}

func glueManagerGetNumLayerGroups(mgr *managerObj, out *C.int32_t) error {
	*out = C.int32_t(mgr.m.NumLayerGroups())
	return nil
}

func glueManagerGetNumLevels(mgr *managerObj, out *C.int32_t) error {
	*out = C.int32_t(len(mgr.m.Layout().Levels))
	return nil
}

func glueManagerGetDeviceKind(mgr *managerObj, out *C.kvcm_device_kind) error {
	*out = mgr.devKind
	return nil
}

func glueManagerGetLayerGroupOf(mgr *managerObj, layerID C.int32_t, out *C.kvcm_layer_group_id) error {
	lg, err := mgr.m.LayerGroupOf(int32(layerID))
	if err != nil {
		return err
	}
	*out = C.kvcm_layer_group_id(lg)
	return nil
}

func glueManagerGetBufferLocation(mgr *managerObj, layerID C.int32_t, role *C.kvcm__const_char, out *C.kvcm_buffer_location) error {
	loc, err := mgr.m.Buffer(int32(layerID), config.DataRole(C.GoString(role)))
	if err != nil {
		return err
	}
	*out = C.kvcm_buffer_location{
		layer_group: C.kvcm_layer_group_id(loc.LifeCycle), pool: C.int32_t(loc.Pool), pool_base: C.kvcm_device_ptr(loc.PoolBase),
		scale: C.int64_t(loc.Scale), offset: C.int64_t(loc.Offset), bytes: C.int64_t(loc.Bytes),
	}
	return nil
}

// levelDescs describes the pool groups of a level: the hot descriptors for
// the GPU level, one-pool descriptors without base addresses for cold ones.
func levelDescs(mgr *managerObj, level C.kvcm_cache_level) ([]layout.PoolGroupDesc, error) {
	if level == 0 {
		if _, err := mgr.m.Quota(0); err != nil { // closed?
			return nil, err
		}
		return mgr.m.PoolGroupDescs(), nil
	}
	stats, err := mgr.m.StorageStats(layout.CacheLevel(level))
	if err != nil {
		return nil, err
	}
	out := make([]layout.PoolGroupDesc, len(stats))
	for i, s := range stats {
		out[i] = layout.PoolGroupDesc{Index: s.Index, NumSlots: s.Total, LifeCycles: s.LifeCycles,
			Pools: []layout.PoolDesc{{SlotBytes: s.PageBytes}}}
	}
	return out, nil
}

func glueManagerGetPoolGroupDescs(mgr *managerObj, level C.kvcm_cache_level, descs *C.kvcm_pool_group_desc, descsCap C.size_t,
	lifeCycles *C.kvcm_layer_group_id, lifeCyclesCap C.size_t, pools *C.kvcm_pool_desc, poolsCap C.size_t,
	numDescs, numLifeCycles, numPools *C.size_t) error {
	ds, err := levelDescs(mgr, level)
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
	q, err := mgr.m.Quota(layout.CacheLevel(level))
	if err != nil {
		return err
	}
	*out = C.int64_t(q)
	return nil
}

func glueManagerResizeLevel(mgr *managerObj, level C.kvcm_cache_level, quota C.int64_t) error {
	return mgr.m.ResizeLevel(layout.CacheLevel(level), int64(quota))
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
	if _, err := mgr.m.Quota(0); err != nil {
		return err
	}
	*out = C.int64_t(mgr.m.ProbeReuse(sc, ts))
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
	*out = cBlockStats(mgr.m.Stats())
	return nil
}

func glueManagerGetAndResetIterationStats(mgr *managerObj, out *C.kvcm_block_stats) error {
	*out = cBlockStats(mgr.m.GetAndResetIterationStats())
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
	st, err := mgr.m.StorageStats(layout.CacheLevel(level))
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
	// Count first (the group count of a level never changes), so that a
	// size query or a too small buffer resets nothing.
	st, err := mgr.m.StorageStats(layout.CacheLevel(level))
	if err != nil {
		return err
	}
	*needed = C.size_t(len(st))
	if _, err := cSlice(stats, capacity, "capacity"); err != nil {
		return err
	}
	if (stats == nil && capacity == 0) || uint64(capacity) < uint64(len(st)) {
		return fill(st, stats, capacity, needed, func(core.PoolGroupStats) C.kvcm_peak_block_stats { return C.kvcm_peak_block_stats{} })
	}
	peaks, err := mgr.m.GetAndResetIterationPeakBlockStats(layout.CacheLevel(level))
	if err != nil {
		return err
	}
	return fill(peaks, stats, capacity, needed, func(p core.PeakBlockStats) C.kvcm_peak_block_stats {
		return C.kvcm_peak_block_stats{index: C.kvcm_pool_group_index(p.Index), peak_used: C.int64_t(p.PeakUsed), total: C.int64_t(p.Total)}
	})
}

func glueManagerGetMigrationStats(mgr *managerObj, stats *C.kvcm_migration_stats, capacity C.size_t, needed *C.size_t) error {
	if _, err := mgr.m.Quota(0); err != nil {
		return err
	}
	ms := mgr.m.MigrationStats()
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
	switch cfgC.device {
	case C.KVCM_DEVICE_AUTO, C.KVCM_DEVICE_EMU, C.KVCM_DEVICE_CUDA:
	default:
		return argError("config.device", "unknown device kind %d", int32(cfgC.device))
	}
	if cfgC.device_ordinal < 0 {
		return argError("config.device_ordinal", "must not be negative, got %d", int32(cfgC.device_ordinal))
	}
	return cfg.Validate(layout.NumLifeCycles(&cfg))
}
