package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdlib.h>
#include <string.h>
#include "kvcm/kvcm.h"

static void* at(uint64_t p) { return (void*)(uintptr_t)p; }
*/
import "C"

import (
	"unsafe"

	_ "github.com/kvcm/kvcm/capi" // the exports
)

// Status is a non-NULL kvcm_status, copied and freed.
type Status struct {
	Code int32
	Name string
	Msg  string
}

func (s *Status) Error() string { return s.Name + ": " + s.Msg }

// Status codes.
const (
	OK               = int32(C.KVCM_OK)
	InvalidArgument  = int32(C.KVCM_ERR_INVALID_ARGUMENT)
	InvalidHandle    = int32(C.KVCM_ERR_INVALID_HANDLE)
	InvalidState     = int32(C.KVCM_ERR_INVALID_STATE)
	OutOfPages       = int32(C.KVCM_ERR_OUT_OF_PAGES)
	InvalidConfig    = int32(C.KVCM_ERR_INVALID_CONFIG)
	CodecRejected    = int32(C.KVCM_ERR_CODEC_REJECTED)
	CodecFailed      = int32(C.KVCM_ERR_CODEC_FAILED)
	DataLost         = int32(C.KVCM_ERR_DATA_LOST)
	IOError          = int32(C.KVCM_ERR_IO)
	ResumeRefused    = int32(C.KVCM_ERR_RESUME_REFUSED)
	BufferTooSmall   = int32(C.KVCM_ERR_BUFFER_TOO_SMALL)
	Unsupported      = int32(C.KVCM_ERR_UNSUPPORTED)
	Internal         = int32(C.KVCM_ERR_INTERNAL)
	Poisoned         = int32(C.KVCM_ERR_POISONED)
	DeviceError      = int32(C.KVCM_ERR_DEVICE)
	MemoryDevice     = int32(C.KVCM_MEMORY_DEVICE)
	MemoryHostMapped = int32(C.KVCM_MEMORY_HOST_MAPPED)
	CacheActive      = int32(C.KVCM_CACHE_ACTIVE)
	CacheSuspended   = int32(C.KVCM_CACHE_SUSPENDED)
	EventStored      = int32(C.KVCM_EVENT_BLOCK_STORED)
	PathGPUToHost    = int32(C.KVCM_PATH_GPU_TO_HOST)
	PathHostToGPU    = int32(C.KVCM_PATH_HOST_TO_GPU)
)

// status converts and frees a status; nil for NULL.
func status(s *C.kvcm_status) error {
	if s == nil {
		return nil
	}
	defer C.kvcm_status_free(s)
	code := int32(C.kvcm_status_get_code(s))
	return &Status{Code: code, Name: C.GoString(C.kvcm_status_code_name(C.kvcm_status_code(code))), Msg: C.GoString(C.kvcm_status_get_message(s))}
}

// CodeOf returns the code of an error from this package (OK for nil, -1
// for another error).
func CodeOf(err error) int32 {
	if err == nil {
		return OK
	}
	if s, ok := err.(*Status); ok {
		return s.Code
	}
	return -1
}

// arena is C memory freed together.
type arena struct{ ptrs []unsafe.Pointer }

func (a *arena) alloc(n uintptr) unsafe.Pointer {
	p := C.calloc(1, C.size_t(n)+1)
	a.ptrs = append(a.ptrs, p)
	return p
}

func (a *arena) str(s string) *C.char {
	p := C.CString(s)
	a.ptrs = append(a.ptrs, unsafe.Pointer(p))
	return p
}

func (a *arena) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
}

func cArray[T any](a *arena, n int) []T {
	if n == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(a.alloc(uintptr(n)*unsafe.Sizeof(z))), n)
}

// Tier is a cache tier: kind 0 GPU, 1 host, 2 disk.
type Tier struct {
	Kind     int32
	Quota    int64
	MaxQuota int64
	Path     string
}

// SharedTier is a kvcm_shared_tier_config.
type SharedTier struct {
	Addresses, Namespace                string
	TTLMs, DialTimeoutMs, CallTimeoutMs int64
	QueueBytes                          int64
	WritePolicy                         int32
}

// Buffer is a layer buffer.
type Buffer struct {
	Role string
	Size int64
}

// Layer is an attention layer.
type Layer struct {
	ID      int32
	Window  int32
	Sinks   int32
	Buffers []Buffer
}

// Config is a manager configuration in Go form.
type Config struct {
	TokensPerBlock     int32
	Tiers              []Tier
	Layers             []Layer
	EnablePartialReuse bool
	ReuseMatchBackoff  int32
	MaxUtilForResume   float64
	EventQueueCapacity uint32
	InitialPoolRatio   []float64
	// BlockKey is the kvcm_block_key (0 sha256, 1 xxh3).
	BlockKey int32
	Shared   *SharedTier
	// DiskPersistent is disk_persistent.
	DiskPersistent bool
	// StructSize and ABIVersion override the versioned header when nonzero
	// (negative ABIVersion writes 0).
	StructSize uint32
	ABIVersion int32
	// Device is the kvcm_device_kind (0 auto, 1 emu, 2 cuda); tests take it
	// from KVCM_ABITEST_DEVICE (emu by default).
	Device int32
}

func (cfg *Config) build(a *arena) *C.kvcm_manager_config {
	c := (*C.kvcm_manager_config)(a.alloc(C.sizeof_kvcm_manager_config))
	c.struct_size = C.sizeof_kvcm_manager_config
	c.abi_version = C.KVCM_ABI_VERSION
	if cfg.StructSize != 0 {
		c.struct_size = C.uint32_t(cfg.StructSize)
	}
	if cfg.ABIVersion < 0 {
		c.abi_version = 0
	}
	c.tokens_per_block = C.int32_t(cfg.TokensPerBlock)
	c.device = C.kvcm_device_kind(cfg.Device)
	c.event_queue_capacity = C.uint32_t(cfg.EventQueueCapacity)
	c.enable_partial_reuse = C.bool(cfg.EnablePartialReuse)
	c.reuse_match_backoff = C.int32_t(cfg.ReuseMatchBackoff)
	c.max_util_for_resume = C.double(cfg.MaxUtilForResume)
	c.block_key = C.kvcm_block_key(cfg.BlockKey)
	c.disk_persistent = C.bool(cfg.DiskPersistent)
	tiers := cArray[C.kvcm_cache_tier_config](a, len(cfg.Tiers))
	for i, t := range cfg.Tiers {
		tiers[i] = C.kvcm_cache_tier_config{kind: C.kvcm_tier_kind(t.Kind), quota: C.int64_t(t.Quota), max_quota: C.int64_t(t.MaxQuota)}
		if t.Path != "" {
			tiers[i].path = a.str(t.Path)
		}
	}
	if len(tiers) > 0 {
		c.cache_tiers, c.num_cache_tiers = &tiers[0], C.size_t(len(tiers))
	}
	layers := cArray[C.kvcm_attention_layer_config](a, len(cfg.Layers))
	for i, l := range cfg.Layers {
		layers[i] = C.kvcm_attention_layer_config{layer_id: C.int32_t(l.ID), sliding_window_size: C.int32_t(l.Window), num_sink_tokens: C.int32_t(l.Sinks)}
		bufs := cArray[C.kvcm_buffer_config](a, len(l.Buffers))
		for j, b := range l.Buffers {
			bufs[j] = C.kvcm_buffer_config{role: a.str(b.Role), size: C.int64_t(b.Size)}
		}
		if len(bufs) > 0 {
			layers[i].buffers, layers[i].num_buffers = &bufs[0], C.size_t(len(bufs))
		}
	}
	if len(layers) > 0 {
		c.layers, c.num_layers = &layers[0], C.size_t(len(layers))
	}
	ratios := cArray[C.double](a, len(cfg.InitialPoolRatio))
	for i, r := range cfg.InitialPoolRatio {
		ratios[i] = C.double(r)
	}
	if len(ratios) > 0 {
		c.initial_pool_ratio, c.num_initial_pool_ratio = &ratios[0], C.size_t(len(ratios))
	}
	if s := cfg.Shared; s != nil {
		sc := (*C.kvcm_shared_tier_config)(a.alloc(C.sizeof_kvcm_shared_tier_config))
		*sc = C.kvcm_shared_tier_config{addresses: a.str(s.Addresses), key_namespace: a.str(s.Namespace),
			ttl_ms: C.int64_t(s.TTLMs), dial_timeout_ms: C.int64_t(s.DialTimeoutMs), call_timeout_ms: C.int64_t(s.CallTimeoutMs),
			queue_bytes: C.int64_t(s.QueueBytes), write_policy: C.kvcm_shared_write_policy(s.WritePolicy)}
		c.shared_tier = sc
	}
	return c
}

// CreateManager calls kvcm_manager_create with the configuration and the
// codec object (nil for NULL).
func CreateManager(cfg Config, codec *Codec) (uint64, error) {
	var a arena
	defer a.free()
	c := cfg.build(&a)
	var cc *C.kvcm_cold_page_codec
	if codec != nil {
		// The codec object is passed from C memory, as a C caller would.
		cc = (*C.kvcm_cold_page_codec)(a.alloc(C.sizeof_kvcm_cold_page_codec))
		*cc = codec.c
	}
	var m C.kvcm_manager = 12345 // proves out is zeroed on failure
	err := status(C.kvcm_manager_create(c, cc, &m))
	return uint64(m), err
}

// CreateManagerNil calls kvcm_manager_create with NULL arguments: config
// (nullConfig) and out (nullOut), with a codec object that must be consumed
// anyway.
func CreateManagerNil(cfg Config, codec *Codec, nullConfig, nullOut bool) error {
	var a arena
	defer a.free()
	c := cfg.build(&a)
	if nullConfig {
		c = nil
	}
	var cc *C.kvcm_cold_page_codec
	if codec != nil {
		cc = (*C.kvcm_cold_page_codec)(a.alloc(C.sizeof_kvcm_cold_page_codec))
		*cc = codec.c
	}
	var m C.kvcm_manager
	out := &m
	if nullOut {
		out = nil
	}
	return status(C.kvcm_manager_create(c, cc, out))
}

// DestroyManager calls kvcm_manager_destroy.
func DestroyManager(m uint64) error { return status(C.kvcm_manager_destroy(C.kvcm_manager(m))) }

// LiveHandles calls kvcm_live_handle_count.
func LiveHandles() uint64 { return uint64(C.kvcm_live_handle_count()) }

// IsPoisoned calls kvcm_is_poisoned.
func IsPoisoned() bool { return bool(C.kvcm_is_poisoned()) }

// DebugPanic calls kvcm_debug_panic.
func DebugPanic(msg string) error {
	p := C.CString(msg)
	defer C.free(unsafe.Pointer(p))
	return status(C.kvcm_debug_panic(p))
}

// ABIVersion calls kvcm_get_abi_version.
func ABIVersion() uint32 { return uint32(C.kvcm_get_abi_version()) }

// LibraryVersion calls kvcm_get_library_version.
func LibraryVersion() string { return C.GoString(C.kvcm_get_library_version()) }

// StatusOfNull returns kvcm_status_get_code(NULL) and kvcm_status_get_message(NULL).
func StatusOfNull() (int32, string) {
	return int32(C.kvcm_status_get_code(nil)), C.GoString(C.kvcm_status_get_message(nil))
}

// CodeName calls kvcm_status_code_name.
func CodeName(code int32) string {
	return C.GoString(C.kvcm_status_code_name(C.kvcm_status_code(code)))
}

// ---- Manager queries ----

// TokensPerBlock calls kvcm_manager_get_tokens_per_block.
func TokensPerBlock(m uint64) (int32, error) {
	var out C.int32_t
	err := status(C.kvcm_manager_get_tokens_per_block(C.kvcm_manager(m), &out))
	return int32(out), err
}

// NumLayerGroups calls kvcm_manager_get_num_layer_groups.
func NumLayerGroups(m uint64) (int32, error) {
	var out C.int32_t
	err := status(C.kvcm_manager_get_num_layer_groups(C.kvcm_manager(m), &out))
	return int32(out), err
}

// NumLevels calls kvcm_manager_get_num_levels.
func NumLevels(m uint64) (int32, error) {
	var out C.int32_t
	err := status(C.kvcm_manager_get_num_levels(C.kvcm_manager(m), &out))
	return int32(out), err
}

// DeviceKind calls kvcm_manager_get_device_kind.
func DeviceKind(m uint64) (int32, error) {
	var out C.kvcm_device_kind
	err := status(C.kvcm_manager_get_device_kind(C.kvcm_manager(m), &out))
	return int32(out), err
}

// GetQuotaNullOut calls kvcm_manager_get_quota with a NULL out.
func GetQuotaNullOut(m uint64) error {
	return status(C.kvcm_manager_get_quota(C.kvcm_manager(m), 0, nil))
}

// Quota calls kvcm_manager_get_quota.
func Quota(m uint64, level int32) (int64, error) {
	var out C.int64_t
	err := status(C.kvcm_manager_get_quota(C.kvcm_manager(m), C.kvcm_cache_level(level), &out))
	return int64(out), err
}

// ResizeLevel calls kvcm_manager_resize_level.
func ResizeLevel(m uint64, level int32, quota int64) error {
	return status(C.kvcm_manager_resize_level(C.kvcm_manager(m), C.kvcm_cache_level(level), C.int64_t(quota)))
}

// BufferLocation is a kvcm_buffer_location.
type BufferLocation struct {
	LayerGroup, Pool     int32
	PoolBase             uint64
	Scale, Offset, Bytes int64
}

// Address returns the address of base page index b of the buffer.
func (l BufferLocation) Address(b int32) uint64 {
	return l.PoolBase + uint64((int64(b)*l.Scale+l.Offset)*l.Bytes)
}

// GetBufferLocation calls kvcm_manager_get_buffer_location.
func GetBufferLocation(m uint64, layer int32, role string) (BufferLocation, error) {
	r := C.CString(role)
	defer C.free(unsafe.Pointer(r))
	var out C.kvcm_buffer_location
	if err := status(C.kvcm_manager_get_buffer_location(C.kvcm_manager(m), C.int32_t(layer), r, &out)); err != nil {
		return BufferLocation{}, err
	}
	return BufferLocation{int32(out.layer_group), int32(out.pool), uint64(out.pool_base), int64(out.scale), int64(out.offset), int64(out.bytes)}, nil
}

// PoolGroupDesc is a kvcm_pool_group_desc in Go form.
type PoolGroupDesc struct {
	Index      int32
	NumSlots   int64
	LifeCycles []int32
	Bases      []uint64
	SlotBytes  []int64
}

// PoolGroupDescs calls kvcm_manager_get_pool_group_descs twice: for the
// counts, then with buffers of exactly that size (extra adds room).
func PoolGroupDescs(m uint64, level int32, short bool) ([]PoolGroupDesc, error) {
	var nd, nl, np C.size_t
	if err := status(C.kvcm_manager_get_pool_group_descs(C.kvcm_manager(m), C.kvcm_cache_level(level), nil, 0, nil, 0, nil, 0, &nd, &nl, &np)); err != nil {
		return nil, err
	}
	var a arena
	defer a.free()
	descs := (*C.kvcm_pool_group_desc)(a.alloc(uintptr(nd) * C.sizeof_kvcm_pool_group_desc))
	lcs := (*C.kvcm_layer_group_id)(a.alloc(uintptr(nl) * 4))
	pools := (*C.kvcm_pool_desc)(a.alloc(uintptr(np) * C.sizeof_kvcm_pool_desc))
	if short {
		np--
	}
	var gd, gl, gp C.size_t
	if err := status(C.kvcm_manager_get_pool_group_descs(C.kvcm_manager(m), C.kvcm_cache_level(level), descs, nd, lcs, nl, pools, np, &gd, &gl, &gp)); err != nil {
		return nil, err
	}
	var out []PoolGroupDesc
	for _, d := range unsafe.Slice(descs, int(gd)) {
		g := PoolGroupDesc{Index: int32(d.index), NumSlots: int64(d.num_slots)}
		for _, lc := range unsafe.Slice(d.life_cycles, int(d.num_life_cycles)) {
			g.LifeCycles = append(g.LifeCycles, int32(lc))
		}
		for _, p := range unsafe.Slice(d.pools, int(d.num_pools)) {
			g.Bases = append(g.Bases, uint64(p.base))
			g.SlotBytes = append(g.SlotBytes, int64(p.slot_bytes))
		}
		out = append(out, g)
	}
	return out, nil
}

// StorageStats calls kvcm_manager_get_storage_stats: total, free and
// available slots summed over the level's groups.
func StorageStats(m uint64, level int32) (total, free, evictable int64, err error) {
	var n C.size_t
	if err := status(C.kvcm_manager_get_storage_stats(C.kvcm_manager(m), C.kvcm_cache_level(level), nil, 0, &n)); err != nil {
		return 0, 0, 0, err
	}
	buf := make([]C.kvcm_pool_group_stats, int(n)+1)
	if err := status(C.kvcm_manager_get_storage_stats(C.kvcm_manager(m), C.kvcm_cache_level(level), &buf[0], n, &n)); err != nil {
		return 0, 0, 0, err
	}
	for _, s := range buf[:n] {
		total += int64(s.total)
		free += int64(s.free)
		evictable += int64(s.evictable)
	}
	return total, free, evictable, nil
}

// PeakStats calls kvcm_manager_get_and_reset_iteration_peak_block_stats
// with the given capacity and returns the peaks and the needed count.
func PeakStats(m uint64, level int32, capacity int) ([]int64, int, error) {
	buf := make([]C.kvcm_peak_block_stats, capacity+1)
	var n C.size_t
	err := status(C.kvcm_manager_get_and_reset_iteration_peak_block_stats(C.kvcm_manager(m), C.kvcm_cache_level(level), &buf[0], C.size_t(capacity), &n))
	var out []int64
	if err == nil {
		for _, s := range buf[:n] {
			out = append(out, int64(s.peak_used))
		}
	}
	return out, int(n), err
}

// MigrationPages calls kvcm_manager_get_migration_stats and returns the
// pages moved per path.
func MigrationPages(m uint64) (map[int32]int64, error) {
	buf := make([]C.kvcm_migration_stats, 16)
	var n C.size_t
	if err := status(C.kvcm_manager_get_migration_stats(C.kvcm_manager(m), &buf[0], 16, &n)); err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, s := range buf[:n] {
		out[int32(s.path)] = int64(s.pages)
	}
	return out, nil
}

// BlockStats calls kvcm_manager_get_stats: reused and missed blocks.
func BlockStats(m uint64) (reused, missed, evictions int64, err error) {
	var s C.kvcm_block_stats
	err = status(C.kvcm_manager_get_stats(C.kvcm_manager(m), &s))
	return int64(s.reused_blocks), int64(s.missed_blocks), int64(s.evictions), err
}

// ConfigSizeV1 and CacheOptionsSizeV1 are sizeof(kvcm_manager_config) and
// sizeof(kvcm_kv_cache_options) as ABI version 1 laid them out: up to their
// first field of version 2.
var (
	ConfigSizeV1       = uint32(unsafe.Offsetof(C.kvcm_manager_config{}.reuse_match_backoff))
	CacheOptionsSizeV1 = uint32(unsafe.Offsetof(C.kvcm_kv_cache_options{}.scope_has_lora_id))
)

// LayerGroupStats is one kvcm_layer_group_iteration_stats (some fields).
type LayerGroupStats struct {
	LayerGroup                                int32
	AllocNew, Reused, FullReused, Missed, Gen int64
}

// LayerGroupIterationStats calls
// kvcm_manager_get_and_reset_layer_group_iteration_stats with the given
// capacity and returns the entries and the needed count.
func LayerGroupIterationStats(m uint64, capacity int) ([]LayerGroupStats, int, error) {
	buf := make([]C.kvcm_layer_group_iteration_stats, capacity+1)
	var n C.size_t
	err := status(C.kvcm_manager_get_and_reset_layer_group_iteration_stats(C.kvcm_manager(m), &buf[0], C.size_t(capacity), &n))
	var out []LayerGroupStats
	if err == nil {
		for _, s := range buf[:n] {
			out = append(out, LayerGroupStats{int32(s.layer_group), int64(s.alloc_new_blocks), int64(s.reused_blocks),
				int64(s.full_reused_blocks), int64(s.missed_blocks), int64(s.gen_alloc_blocks)})
		}
	}
	return out, int(n), err
}

// BlockEvent is a drained kvcm_block_event (some fields).
type BlockEvent struct {
	Kind, Level, OldLevel, Priority, OldPriority int32
	Key                                          uint64
	Tokens                                       []int32
}

// DrainBlockEvents calls kvcm_manager_drain_block_events until it returns
// no event.
func DrainBlockEvents(m uint64) ([]BlockEvent, error) {
	var out []BlockEvent
	for {
		// Fresh buffers: drained events point into the tokens, and cgo
		// refuses Go memory holding Go pointers.
		evs := make([]C.kvcm_block_event, 64)
		toks := make([]C.kvcm_token, 1024)
		var ne, nt C.size_t
		if err := status(C.kvcm_manager_drain_block_events(C.kvcm_manager(m), &evs[0], 64, &toks[0], 1024, &ne, &nt, nil)); err != nil {
			return nil, err
		}
		if ne == 0 {
			return out, nil
		}
		for _, e := range evs[:ne] {
			ev := BlockEvent{Kind: int32(e.kind), Level: int32(e.level), OldLevel: int32(e.old_level),
				Priority: int32(e.priority), OldPriority: int32(e.old_priority), Key: uint64(e.key)}
			if e.num_tokens > 0 {
				for _, t := range unsafe.Slice(e.tokens, int(e.num_tokens)) {
					ev.Tokens = append(ev.Tokens, int32(t))
				}
			}
			out = append(out, ev)
		}
	}
}

// Event is a drained kvcm_cache_event.
type Event struct {
	Seq     uint64
	Kind    int32
	Key     uint64
	Tokens  []int32
	CacheID uint64
	Level   int32
}

// DrainEvents calls kvcm_manager_drain_events with the given capacities.
func DrainEvents(m uint64, eventsCap, tokensCap int) ([]Event, uint64, error) {
	evs := make([]C.kvcm_cache_event, eventsCap+1)
	toks := make([]C.kvcm_token, tokensCap+1)
	var ne, nt C.size_t
	var dropped C.uint64_t
	if err := status(C.kvcm_manager_drain_events(C.kvcm_manager(m), &evs[0], C.size_t(eventsCap), &toks[0], C.size_t(tokensCap), &ne, &nt, &dropped)); err != nil {
		return nil, 0, err
	}
	var out []Event
	for _, e := range evs[:ne] {
		ev := Event{Seq: uint64(e.seq), Kind: int32(e.kind), Key: uint64(e.key), CacheID: uint64(e.cache_id), Level: int32(e.level)}
		if e.num_tokens > 0 {
			for _, t := range unsafe.Slice(e.tokens, int(e.num_tokens)) {
				ev.Tokens = append(ev.Tokens, int32(t))
			}
		}
		out = append(out, ev)
	}
	return out, uint64(dropped), nil
}

// ProbeReuse calls kvcm_manager_probe_reuse.
func ProbeReuse(m uint64, lora int64, salt string, tokens []int32) (int64, error) {
	var a arena
	defer a.free()
	scope := (*C.kvcm_reuse_scope)(a.alloc(C.sizeof_kvcm_reuse_scope))
	scope.lora_id = C.int64_t(lora)
	if salt != "" {
		scope.salt, scope.salt_len = a.str(salt), C.size_t(len(salt))
	}
	toks := cArray[C.kvcm_token](&a, len(tokens))
	for i, t := range tokens {
		toks[i] = C.kvcm_token(t)
	}
	var p *C.kvcm_token
	if len(toks) > 0 {
		p = &toks[0]
	}
	var out C.int64_t
	err := status(C.kvcm_manager_probe_reuse(C.kvcm_manager(m), scope, p, C.size_t(len(tokens)), &out))
	return int64(out), err
}

// ---- KV caches ----

// CreateCache calls kvcm_kv_cache_create.
func CreateCache(m uint64, lora int64, salt string, tokens []int32) (uint64, error) {
	return createCache(m, lora, salt, tokens, -1)
}

// CreateCacheWithPriority calls kvcm_kv_cache_create with a C priority
// callback that returns prio.
func CreateCacheWithPriority(m uint64, tokens []int32, prio int32) (uint64, error) {
	return createCache(m, 0, "", tokens, prio)
}

func createCache(m uint64, lora int64, salt string, tokens []int32, prio int32) (uint64, error) {
	var a arena
	defer a.free()
	o := (*C.kvcm_kv_cache_options)(a.alloc(C.sizeof_kvcm_kv_cache_options))
	o.struct_size, o.abi_version = C.sizeof_kvcm_kv_cache_options, C.KVCM_ABI_VERSION
	o.scope.lora_id = C.int64_t(lora)
	if salt != "" {
		o.scope.salt, o.scope.salt_len = a.str(salt), C.size_t(len(salt))
	}
	toks := cArray[C.kvcm_token](&a, len(tokens))
	for i, t := range tokens {
		toks[i] = C.kvcm_token(t)
	}
	if len(toks) > 0 {
		o.input_tokens, o.num_input_tokens = &toks[0], C.size_t(len(toks))
	}
	if prio >= 0 {
		setPriority(o, prio)
	}
	var c C.kvcm_kv_cache
	err := status(C.kvcm_kv_cache_create(C.kvcm_manager(m), o, &c))
	return uint64(c), err
}

// CreateCacheBadOptions calls kvcm_kv_cache_create with struct_size 4.
func CreateCacheBadOptions(m uint64) error {
	var a arena
	defer a.free()
	o := (*C.kvcm_kv_cache_options)(a.alloc(C.sizeof_kvcm_kv_cache_options))
	o.struct_size, o.abi_version = 4, C.KVCM_ABI_VERSION
	var c C.kvcm_kv_cache
	return status(C.kvcm_kv_cache_create(C.kvcm_manager(m), o, &c))
}

// CloseCache calls kvcm_kv_cache_close.
func CloseCache(c uint64) error { return status(C.kvcm_kv_cache_close(C.kvcm_kv_cache(c))) }

// Resume calls kvcm_kv_cache_resume.
func Resume(c, stream uint64) error {
	return status(C.kvcm_kv_cache_resume(C.kvcm_kv_cache(c), C.kvcm_stream(stream)))
}

// Suspend calls kvcm_kv_cache_suspend.
func Suspend(c uint64) error { return status(C.kvcm_kv_cache_suspend(C.kvcm_kv_cache(c))) }

// Resize calls kvcm_kv_cache_resize.
func Resize(c uint64, capacity, history int64) error {
	return status(C.kvcm_kv_cache_resize(C.kvcm_kv_cache(c), C.int64_t(capacity), C.int64_t(history)))
}

// Commit calls kvcm_kv_cache_commit.
func Commit(c uint64, tokens []int32, isEnd bool) error {
	var a arena
	defer a.free()
	toks := cArray[C.kvcm_token](&a, len(tokens))
	for i, t := range tokens {
		toks[i] = C.kvcm_token(t)
	}
	var p *C.kvcm_token
	if len(toks) > 0 {
		p = &toks[0]
	}
	return status(C.kvcm_kv_cache_commit(C.kvcm_kv_cache(c), p, C.size_t(len(tokens)), C.bool(isEnd)))
}

// CommitNull calls kvcm_kv_cache_commit with NULL tokens and a count.
func CommitNull(c uint64, n int) error {
	return status(C.kvcm_kv_cache_commit(C.kvcm_kv_cache(c), nil, C.size_t(n), false))
}

// CacheInfo is what the kvcm_kv_cache_get_* getters report.
type CacheInfo struct {
	Status                                    int32
	ID                                        uint64
	Committed, History, Capacity, ReusedToken int64
}

// GetCacheInfo calls every getter.
func GetCacheInfo(c uint64) (CacheInfo, error) {
	h := C.kvcm_kv_cache(c)
	var st C.kvcm_cache_status
	var id C.uint64_t
	var com, hist, capa, reused C.int64_t
	for _, s := range []*C.kvcm_status{
		C.kvcm_kv_cache_get_status(h, &st), C.kvcm_kv_cache_get_id(h, &id),
		C.kvcm_kv_cache_get_num_committed_tokens(h, &com), C.kvcm_kv_cache_get_history_length(h, &hist),
		C.kvcm_kv_cache_get_capacity(h, &capa), C.kvcm_kv_cache_get_reused_tokens(h, &reused),
	} {
		if err := status(s); err != nil {
			return CacheInfo{}, err
		}
	}
	return CacheInfo{int32(st), uint64(id), int64(com), int64(hist), int64(capa), int64(reused)}, nil
}

// BasePageIndices calls kvcm_kv_cache_get_base_page_indices: first for the
// count, then with a buffer of capacity (count when capacity < 0).
func BasePageIndices(c uint64, lg int32, capacity int) ([]int32, int, error) {
	var n C.size_t
	if err := status(C.kvcm_kv_cache_get_base_page_indices(C.kvcm_kv_cache(c), C.kvcm_layer_group_id(lg), nil, 0, &n)); err != nil {
		return nil, 0, err
	}
	if capacity < 0 {
		capacity = int(n)
	}
	buf := make([]C.int32_t, capacity+1)
	var got C.size_t
	err := status(C.kvcm_kv_cache_get_base_page_indices(C.kvcm_kv_cache(c), C.kvcm_layer_group_id(lg), &buf[0], C.size_t(capacity), &got))
	if err != nil {
		return nil, int(got), err
	}
	out := make([]int32, got)
	for i := range out {
		out[i] = int32(buf[i])
	}
	return out, int(n), nil
}

// ---- Streams and memory ----

// CreateStream calls kvcm_manager_create_stream.
func CreateStream(m uint64) (uint64, error) {
	var s C.kvcm_stream
	err := status(C.kvcm_manager_create_stream(C.kvcm_manager(m), &s))
	return uint64(s), err
}

// DestroyStream calls kvcm_manager_destroy_stream.
func DestroyStream(m, s uint64) error {
	return status(C.kvcm_manager_destroy_stream(C.kvcm_manager(m), C.kvcm_stream(s)))
}

// Synchronize calls kvcm_stream_synchronize.
func Synchronize(s uint64) error { return status(C.kvcm_stream_synchronize(C.kvcm_stream(s))) }

// Alloc calls kvcm_manager_alloc_memory.
func Alloc(m uint64, kind int32, size uint64) (uint64, error) {
	var p C.kvcm_device_ptr
	err := status(C.kvcm_manager_alloc_memory(C.kvcm_manager(m), C.kvcm_memory_kind(kind), C.uint64_t(size), &p))
	return uint64(p), err
}

// Free calls kvcm_manager_free_memory.
func Free(m, p uint64) error {
	return status(C.kvcm_manager_free_memory(C.kvcm_manager(m), C.kvcm_device_ptr(p)))
}

// StreamAlloc calls kvcm_stream_alloc_memory.
func StreamAlloc(s uint64, kind int32, size uint64) (uint64, error) {
	var p C.kvcm_device_ptr
	err := status(C.kvcm_stream_alloc_memory(C.kvcm_stream(s), C.kvcm_memory_kind(kind), C.uint64_t(size), &p))
	return uint64(p), err
}

// StreamFree calls kvcm_stream_free_memory.
func StreamFree(s, p uint64) error {
	return status(C.kvcm_stream_free_memory(C.kvcm_stream(s), C.kvcm_device_ptr(p)))
}

// Copy is a kvcm_copy_desc.
type Copy struct{ Dst, Src, Size uint64 }

// BatchCopy calls kvcm_stream_batch_copy.
func BatchCopy(s uint64, copies []Copy) error {
	var a arena
	defer a.free()
	d := cArray[C.kvcm_copy_desc](&a, len(copies))
	for i, c := range copies {
		d[i] = C.kvcm_copy_desc{dst: C.kvcm_device_ptr(c.Dst), src: C.kvcm_device_ptr(c.Src), size: C.uint64_t(c.Size)}
	}
	var p *C.kvcm_copy_desc
	if len(d) > 0 {
		p = &d[0]
	}
	return status(C.kvcm_stream_batch_copy(C.kvcm_stream(s), p, C.size_t(len(copies))))
}

// CopyFromHost calls kvcm_stream_copy_from_host with a C copy of data.
func CopyFromHost(s, dst uint64, data []byte) error {
	p := C.CBytes(data)
	defer C.free(p)
	return status(C.kvcm_stream_copy_from_host(C.kvcm_stream(s), C.kvcm_device_ptr(dst), p, C.size_t(len(data))))
}

// WriteHost writes data into host-mapped memory at p.
func WriteHost(p uint64, data []byte) {
	if len(data) > 0 {
		C.memcpy(C.at(C.uint64_t(p)), unsafe.Pointer(&data[0]), C.size_t(len(data)))
	}
}

// ReadHost reads n bytes of host-mapped memory at p.
func ReadHost(p uint64, n int) []byte {
	return C.GoBytes(C.at(C.uint64_t(p)), C.int(n))
}

// ValidateConfig calls kvcm_config_validate.
func ValidateConfig(cfg Config) error {
	var a arena
	defer a.free()
	return status(C.kvcm_config_validate(cfg.build(&a)))
}
