package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdint.h>
#include "kvcm/kvcm.h"
*/
import "C"

import "unsafe"

// AggregatedPage is a kvcm_aggregated_page_desc in Go form: Members are
// positions in the buffers argument, Expansions their expansions.
type AggregatedPage struct {
	Base         uint64
	Size, Stride int64
	LayerGroup   int32
	Members      []int
	Expansions   []int32
}

// BufferName names a buffer for GetAggregatedPages.
type BufferName struct {
	Layer int32
	Role  string
}

// GetAggregatedPages calls kvcm_manager_get_aggregated_pages with room for
// descsCap runs and membersCap members; it returns the runs when they fit
// and the number of runs the library reported.
func GetAggregatedPages(m uint64, buffers []BufferName, descsCap, membersCap int) ([]AggregatedPage, int, error) {
	var a arena
	defer a.free()
	in := cArray[C.kvcm_buffer_id](&a, len(buffers))
	for i, b := range buffers {
		in[i].layer_id, in[i].role = C.int32_t(b.Layer), a.str(b.Role)
	}
	descs := cArray[C.kvcm_aggregated_page_desc](&a, descsCap)
	members := cArray[C.kvcm_expanded_buffer](&a, membersCap)
	var pin *C.kvcm_buffer_id
	var pd *C.kvcm_aggregated_page_desc
	var pm *C.kvcm_expanded_buffer
	if len(buffers) > 0 {
		pin = &in[0]
	}
	if descsCap > 0 {
		pd = &descs[0]
	}
	if membersCap > 0 {
		pm = &members[0]
	}
	var n C.size_t
	err := status(C.kvcm_manager_get_aggregated_pages(C.kvcm_manager(m), pin, C.size_t(len(buffers)), pd,
		C.size_t(descsCap), pm, C.size_t(membersCap), &n))
	if err != nil || int(n) > descsCap {
		return nil, int(n), err
	}
	var out []AggregatedPage
	for _, d := range descs[:n] {
		p := AggregatedPage{Base: uint64(d.base), Size: int64(d.size), Stride: int64(d.stride), LayerGroup: int32(d.layer_group)}
		for _, mb := range unsafe.Slice(d.buffers, int(d.num_buffers)) {
			p.Members = append(p.Members, int(mb.buffer))
			p.Expansions = append(p.Expansions, int32(mb.expansion))
		}
		out = append(out, p)
	}
	return out, int(n), nil
}

// AggregatedPageIndices calls kvcm_kv_cache_get_aggregated_page_indices.
func AggregatedPageIndices(c uint64, lg, beam int32, validOnly bool, capacity int) ([]int32, int, error) {
	var a arena
	defer a.free()
	buf := cArray[C.int32_t](&a, capacity)
	var p *C.int32_t
	if capacity > 0 {
		p = &buf[0]
	}
	var needed C.size_t
	err := status(C.kvcm_kv_cache_get_aggregated_page_indices(C.kvcm_kv_cache(c), C.kvcm_layer_group_id(lg), C.int32_t(beam),
		C.bool(validOnly), p, C.size_t(capacity), &needed))
	var out []int32
	if err == nil && int(needed) <= capacity {
		for _, i := range buf[:needed] {
			out = append(out, int32(i))
		}
	}
	return out, int(needed), err
}

// BlockKeys calls kvcm_block_keys (SHA-256 keys, no LoRA, no salt) with
// digests at positions and digestBytes as given, room for capacity keys.
func BlockKeys(tpb int32, tokens []int32, positions []uint64, digestBytes []byte, partial bool, capacity int) ([]uint64, int, error) {
	var a arena
	defer a.free()
	scope := Scope{}.build(&a)
	toks := tokensOf(&a, tokens)
	pos := cArray[C.size_t](&a, len(positions))
	for i, p := range positions {
		pos[i] = C.size_t(p)
	}
	var pp *C.size_t
	if len(pos) > 0 {
		pp = &pos[0]
	}
	var pb *C.char
	if len(digestBytes) > 0 {
		pb = a.str(string(digestBytes))
	}
	keys := cArray[C.uint64_t](&a, capacity)
	var pk *C.uint64_t
	if capacity > 0 {
		pk = &keys[0]
	}
	var needed C.size_t
	err := status(C.kvcm_block_keys(C.KVCM_BLOCK_KEY_SHA256, scope, false, C.int32_t(tpb), toks, C.size_t(len(tokens)), pp,
		C.size_t(len(positions)), pb, C.size_t(len(digestBytes)), C.bool(partial), pk, C.size_t(capacity), &needed))
	var out []uint64
	if err == nil && int(needed) <= capacity {
		for _, k := range keys[:needed] {
			out = append(out, uint64(k))
		}
	}
	return out, int(needed), err
}
