package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdint.h>
#include "kvcm/kvcm.h"

static int64_t tc_lg_calls[64];
static int tc_lg_ncalls;

// tc_lg_priority records (block, layer group) and returns 10 + layer group.
static int32_t tc_lg_priority(void* user, int64_t block, kvcm_layer_group_id lg, int32_t* priority) {
	(void)user;
	if (tc_lg_ncalls < 64) {
		tc_lg_calls[tc_lg_ncalls++] = block * 1000 + lg;
	}
	*priority = 10 + lg;
	return 0;
}

static void tc_set_lg_priority(kvcm_kv_cache_options* o) { o->layer_group_priority = tc_lg_priority; }
static void tc_reset_lg_calls(void) { tc_lg_ncalls = 0; }
static int tc_lg_ncalls_get(void) { return tc_lg_ncalls; }
static int64_t tc_lg_call(int i) { return tc_lg_calls[i]; }
*/
import "C"

// Scope is a reuse scope of ABI version 2: HasLoRA makes LoRA an adapter id
// even when it is 0.
type Scope struct {
	LoRA    int64
	HasLoRA bool
	Salt    string
}

func (sc Scope) build(a *arena) *C.kvcm_reuse_scope {
	s := (*C.kvcm_reuse_scope)(a.alloc(C.sizeof_kvcm_reuse_scope))
	s.lora_id = C.int64_t(sc.LoRA)
	if sc.Salt != "" {
		s.salt, s.salt_len = a.str(sc.Salt), C.size_t(len(sc.Salt))
	}
	return s
}

func tokensOf(a *arena, tokens []int32) *C.kvcm_token {
	toks := cArray[C.kvcm_token](a, len(tokens))
	for i, t := range tokens {
		toks[i] = C.kvcm_token(t)
	}
	if len(toks) == 0 {
		return nil
	}
	return &toks[0]
}

// ProbeReuseV2 calls kvcm_manager_probe_reuse_v2.
func ProbeReuseV2(m uint64, sc Scope, tokens []int32) (int64, error) {
	var a arena
	defer a.free()
	var out C.int64_t
	err := status(C.kvcm_manager_probe_reuse_v2(C.kvcm_manager(m), sc.build(&a), C.bool(sc.HasLoRA),
		tokensOf(&a, tokens), C.size_t(len(tokens)), &out))
	return int64(out), err
}

// ProbeFirstNewBlockKey calls kvcm_manager_probe_first_new_block_key.
func ProbeFirstNewBlockKey(m uint64, sc Scope, tokens []int32) (uint64, bool, error) {
	var a arena
	defer a.free()
	var key C.uint64_t
	var found C.bool
	err := status(C.kvcm_manager_probe_first_new_block_key(C.kvcm_manager(m), sc.build(&a), C.bool(sc.HasLoRA),
		tokensOf(&a, tokens), C.size_t(len(tokens)), &key, &found))
	return uint64(key), bool(found), err
}

// CreateCacheV2 calls kvcm_kv_cache_create with an ABI version 2 scope and,
// when lgPriority is set, the per-layer-group priority callback (which
// records its calls and returns 10 + layer group). A nonzero structSize
// overrides sizeof(kvcm_kv_cache_options).
func CreateCacheV2(m uint64, sc Scope, tokens []int32, lgPriority bool, structSize uint32) (uint64, error) {
	var a arena
	defer a.free()
	o := (*C.kvcm_kv_cache_options)(a.alloc(C.sizeof_kvcm_kv_cache_options))
	o.struct_size, o.abi_version = C.sizeof_kvcm_kv_cache_options, C.KVCM_ABI_VERSION
	if structSize != 0 {
		o.struct_size = C.uint32_t(structSize)
	}
	o.scope = *sc.build(&a)
	o.scope_has_lora_id = C.bool(sc.HasLoRA)
	o.input_tokens, o.num_input_tokens = tokensOf(&a, tokens), C.size_t(len(tokens))
	if lgPriority {
		C.tc_set_lg_priority(o)
	}
	var c C.kvcm_kv_cache
	err := status(C.kvcm_kv_cache_create(C.kvcm_manager(m), o, &c))
	return uint64(c), err
}

// CreateCacheBothPriorities sets priority and layer_group_priority.
func CreateCacheBothPriorities(m uint64) error {
	var a arena
	defer a.free()
	o := (*C.kvcm_kv_cache_options)(a.alloc(C.sizeof_kvcm_kv_cache_options))
	o.struct_size, o.abi_version = C.sizeof_kvcm_kv_cache_options, C.KVCM_ABI_VERSION
	setPriority(o, 50)
	C.tc_set_lg_priority(o)
	var c C.kvcm_kv_cache
	return status(C.kvcm_kv_cache_create(C.kvcm_manager(m), o, &c))
}

// LayerGroupPriorityCalls returns and resets the (block, layer group) calls
// of the per-layer-group priority callback.
func LayerGroupPriorityCalls() [][2]int64 {
	var out [][2]int64
	for i := range int(C.tc_lg_ncalls_get()) {
		v := int64(C.tc_lg_call(C.int(i)))
		out = append(out, [2]int64{v / 1000, v % 1000})
	}
	C.tc_reset_lg_calls()
	return out
}

// SetStream calls kvcm_kv_cache_set_stream.
func SetStream(c, stream uint64) error {
	return status(C.kvcm_kv_cache_set_stream(C.kvcm_kv_cache(c), C.kvcm_stream(stream)))
}

// CommittedTokens calls kvcm_kv_cache_get_committed_tokens.
func CommittedTokens(c uint64, capacity int) ([]int32, int, error) {
	var a arena
	defer a.free()
	buf := cArray[C.kvcm_token](&a, capacity)
	var p *C.kvcm_token
	if capacity > 0 {
		p = &buf[0]
	}
	var needed C.size_t
	err := status(C.kvcm_kv_cache_get_committed_tokens(C.kvcm_kv_cache(c), p, C.size_t(capacity), &needed))
	var out []int32
	if err == nil && int(needed) <= capacity {
		for _, t := range buf[:needed] {
			out = append(out, int32(t))
		}
	}
	return out, int(needed), err
}

// ClearReusableBlocks calls kvcm_manager_clear_reusable_blocks.
func ClearReusableBlocks(m uint64) error {
	return status(C.kvcm_manager_clear_reusable_blocks(C.kvcm_manager(m)))
}

// NumOpenCaches calls kvcm_manager_get_num_open_caches.
func NumOpenCaches(m uint64) (int, error) {
	var out C.size_t
	err := status(C.kvcm_manager_get_num_open_caches(C.kvcm_manager(m), &out))
	return int(out), err
}

// CacheStats calls kvcm_kv_cache_get_stats: alloc total, alloc new, reused
// and missed blocks.
func CacheStats(c uint64) ([4]int64, error) {
	var s C.kvcm_block_stats
	err := status(C.kvcm_kv_cache_get_stats(C.kvcm_kv_cache(c), &s))
	return [4]int64{int64(s.alloc_total_blocks), int64(s.alloc_new_blocks), int64(s.reused_blocks), int64(s.missed_blocks)}, err
}

// CommitPendingStats calls kvcm_kv_cache_commit_pending_stats.
func CommitPendingStats(c uint64) error {
	return status(C.kvcm_kv_cache_commit_pending_stats(C.kvcm_kv_cache(c)))
}

// PendingStats calls kvcm_kv_cache_get_pending_stats: alloc_total_blocks,
// alloc_new_blocks, reused_blocks and missed_blocks.
func PendingStats(c uint64) ([4]int64, error) {
	var out C.kvcm_kv_cache_stats_delta
	err := status(C.kvcm_kv_cache_get_pending_stats(C.kvcm_kv_cache(c), &out))
	return [4]int64{int64(out.alloc_total_blocks), int64(out.alloc_new_blocks), int64(out.reused_blocks),
		int64(out.missed_blocks)}, err
}

// DiscardPendingStats calls kvcm_kv_cache_discard_pending_stats.
func DiscardPendingStats(c uint64) error {
	return status(C.kvcm_kv_cache_discard_pending_stats(C.kvcm_kv_cache(c)))
}

// CachedTokensByLevel calls kvcm_kv_cache_get_cached_tokens_by_level.
func CachedTokensByLevel(c uint64, capacity int) ([]int64, int, error) {
	var a arena
	defer a.free()
	buf := cArray[C.int64_t](&a, capacity)
	var p *C.int64_t
	if capacity > 0 {
		p = &buf[0]
	}
	var needed C.size_t
	err := status(C.kvcm_kv_cache_get_cached_tokens_by_level(C.kvcm_kv_cache(c), p, C.size_t(capacity), &needed))
	var out []int64
	if err == nil && int(needed) <= capacity {
		for _, n := range buf[:needed] {
			out = append(out, int64(n))
		}
	}
	return out, int(needed), err
}

// BeamWidth calls kvcm_kv_cache_get_beam_width.
func BeamWidth(c uint64) (int32, error) {
	var out C.int32_t
	err := status(C.kvcm_kv_cache_get_beam_width(C.kvcm_kv_cache(c), &out))
	return int32(out), err
}

// SetBeamWidth calls kvcm_kv_cache_set_beam_width.
func SetBeamWidth(c uint64, width int32) error {
	return status(C.kvcm_kv_cache_set_beam_width(C.kvcm_kv_cache(c), C.int32_t(width)))
}

// BeamPageIndices calls kvcm_kv_cache_get_beam_base_page_indices with room
// for capacity indices.
func BeamPageIndices(c uint64, lg, beam int32, capacity int) ([]int32, error) {
	var a arena
	defer a.free()
	buf := cArray[C.int32_t](&a, capacity)
	var p *C.int32_t
	if capacity > 0 {
		p = &buf[0]
	}
	var needed C.size_t
	err := status(C.kvcm_kv_cache_get_beam_base_page_indices(C.kvcm_kv_cache(c), C.kvcm_layer_group_id(lg), C.int32_t(beam), p, C.size_t(capacity), &needed))
	if err != nil {
		return nil, err
	}
	out := make([]int32, needed)
	for i := range out {
		out[i] = int32(buf[i])
	}
	return out, nil
}

// CommitBeamSearch calls kvcm_kv_cache_commit_beam_search; nil indices pass
// NULL with numIndices entries.
func CommitBeamSearch(c uint64, tokens []int32, indices []int32, numIndices int) error {
	var a arena
	defer a.free()
	toks := cArray[C.kvcm_token](&a, len(tokens))
	for i, t := range tokens {
		toks[i] = C.kvcm_token(t)
	}
	var tp *C.kvcm_token
	if len(toks) > 0 {
		tp = &toks[0]
	}
	var ip *C.int32_t
	if indices != nil {
		is := cArray[C.int32_t](&a, len(indices))
		for i, x := range indices {
			is[i] = C.int32_t(x)
		}
		ip = &is[0]
	}
	return status(C.kvcm_kv_cache_commit_beam_search(C.kvcm_kv_cache(c), tp, C.size_t(len(tokens)), ip, C.size_t(numIndices), false))
}
