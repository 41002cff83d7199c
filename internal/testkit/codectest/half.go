// Package codectest provides cold-page codecs for tests of the manager, the C
// ABI and the demos: Half (a fixed-ratio "compressing" codec), Faulty (a
// wrapper that injects failures and counts calls), DeviceIndexed (a codec with
// device-located indices) and Batching (declared equivalence classes and cold
// sizes). None is meant for production.
package codectest

import (
	"sync"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// Half is a fixed-ratio codec for 16-bit little-endian elements: the cold
// page keeps only the high byte (the odd-offset byte) of each 2-byte element,
// so QueryColdPageBytes is half the hot page bytes, and Decode writes each high
// byte back with a zero low byte. It is lossless exactly for data whose low
// bytes are zero; otherwise Decode zeroes every low byte.
//
// Cold format of lifecycle lg: for each pool of lg's hot group in pool order,
// the high bytes of that pool's slot, back to back. Every pool's SlotBytes must
// be even (Configure rejects an odd one).
//
// It is an honest CPU codec: device memory is not host-addressable, so each
// call stages through a host-mapped scratch buffer owned by the codec. Encode
// enqueues: one BatchCopy gathering the hot slots into scratch (one descriptor
// per page and pool), a HostFunc compacting the high bytes in place, one
// BatchCopy scattering the cold pages to dstBase, and a HostFunc returning the
// scratch to the codec. Decode mirrors it. A scratch buffer is reused only
// after the stream work of the call that used it has finished. Indices are on
// the Host; batching is the identity.
//
// Close frees the scratch buffers; the owner must have waited for the stream
// work of every call first.
type Half struct {
	mu         sync.Mutex
	hot        *codec.HotLayout
	configured bool
	closed     bool
	scratch    *scratchPool

	in, out []device.CopyDesc
	pairs   []codec.PageIndexPair
}

var _ codec.ColdPageCodec = (*Half)(nil)

// NewHalf returns a Half that allocates its scratch from dev.
func NewHalf(dev device.Device) *Half {
	return &Half{scratch: newScratchPool(dev)}
}

// Configure accepts a well-formed layout (codec.NewHotLayout) whose pools all
// have an even SlotBytes; a second call returns false.
func (h *Half) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.configured {
		return false
	}
	h.configured = true
	hl, err := codec.NewHotLayout(gpuDescs)
	if err != nil {
		return false
	}
	for _, g := range hl.Groups() {
		for _, p := range g.Pools {
			if p.SlotBytes%2 != 0 {
				return false
			}
		}
	}
	h.hot = hl
	return true
}

// QueryColdPageBytes is half of lg's hot page bytes.
func (h *Half) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hot.PageBytes(lg) / 2
}

// GetBatchingLayerGroupID is the identity for known lifecycles.
func (h *Half) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hot.GetBatchingLayerGroupID(lg)
}

// QueryPageIndexLocation is Host for known lifecycles.
func (h *Half) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.hot.Known(lg) {
		return codec.BadLocation
	}
	return codec.Host
}

// Encode stages the hot slots idx[i].Src through scratch and writes their
// high bytes as cold pages at dstBase + idx[i].Dst*QueryColdPageBytes(lg).
func (h *Half) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return h.transfer(lg, codec.ToCold, dstBase, idx, stream)
}

// Decode stages the cold pages at srcBase + idx[i].Src*QueryColdPageBytes(lg)
// through scratch and writes them, expanded with zero low bytes, into hot
// slots idx[i].Dst.
func (h *Half) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return h.transfer(lg, codec.ToHot, srcBase, idx, stream)
}

func (h *Half) transfer(lg layout.LayerGroupID, dir codec.Direction, coldBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || !h.hot.Known(lg) || idx.Location() != codec.Host {
		return false
	}
	src := idx.Host()
	n := int64(len(src))
	if n == 0 {
		return true
	}
	if stream == nil || coldBase == 0 {
		return false
	}
	page := h.hot.PageBytes(lg)
	cold := page / 2

	// Validate the cold side (the hot side is validated while building the
	// staging descriptors) before taking scratch.
	for _, p := range src {
		c := p.Dst
		if dir == codec.ToHot {
			c = p.Src
		}
		if c < 0 || int64(c) > (1<<62)/cold {
			return false
		}
	}
	mem, err := h.scratch.get(n * page)
	if err != nil {
		return false
	}
	sp := mem.Ptr()

	// Pairs against scratch: scratch page k is the concatenated hot page k.
	h.pairs = h.pairs[:0]
	for k, p := range src {
		if dir == codec.ToCold {
			h.pairs = append(h.pairs, codec.PageIndexPair{Dst: int32(k), Src: p.Src})
		} else {
			h.pairs = append(h.pairs, codec.PageIndexPair{Dst: p.Dst, Src: int32(k)})
		}
	}
	// Cold-side copies between scratch (page k of the compact cold array at
	// k*cold) and the caller's cold base.
	h.out = h.out[:0]
	for k, p := range src {
		if dir == codec.ToCold {
			h.out = append(h.out, device.CopyDesc{Dst: coldBase.Add(int64(p.Dst) * cold), Src: sp.Add(int64(k) * cold), Size: cold})
		} else {
			h.out = append(h.out, device.CopyDesc{Dst: sp.Add(int64(k) * cold), Src: coldBase.Add(int64(p.Src) * cold), Size: cold})
		}
	}
	hotDir := codec.ToCold // gather hot slots into scratch
	if dir == codec.ToHot {
		hotDir = codec.ToHot // scatter scratch into hot slots
	}
	h.in, err = h.hot.AppendConcatCopies(h.in[:0], lg, hotDir, sp, page, h.pairs)
	if err != nil {
		h.scratch.put(mem) // nothing enqueued
		return false
	}

	buf := mem.Host()[:n*page]
	var first, last []device.CopyDesc
	var transform func() error
	if dir == codec.ToCold {
		first, last = h.in, h.out
		transform = func() error { compactHigh(buf); return nil }
	} else {
		first, last = h.out, h.in
		transform = func() error { expandHigh(buf); return nil }
	}
	if stream.BatchCopy(first) != nil {
		h.scratch.put(mem) // nothing enqueued
		return false
	}
	// From here on work that uses mem is enqueued: on a failure mem is
	// abandoned to Close, and nothing has been written to the destination.
	if stream.HostFunc(transform) != nil || stream.BatchCopy(last) != nil {
		h.scratch.orphan(mem)
		return false
	}
	if stream.HostFunc(func() error { h.scratch.put(mem); return nil }) != nil {
		h.scratch.orphan(mem) // the transfer itself is fully enqueued
	}
	return true
}

// compactHigh moves the high (odd-offset) byte of each 2-byte element of buf
// to the front, in place: the first len(buf)/2 bytes become the cold pages.
func compactHigh(buf []byte) {
	for i := 0; 2*i+1 < len(buf); i++ {
		buf[i] = buf[2*i+1]
	}
}

// expandHigh is the inverse of compactHigh for zero low bytes: the first
// len(buf)/2 bytes become the high bytes of len(buf)/2 elements with zero low
// bytes, in place, working backwards.
func expandHigh(buf []byte) {
	for i := len(buf)/2 - 1; i >= 0; i-- {
		b := buf[i]
		buf[2*i] = 0
		buf[2*i+1] = b
	}
}

// ScratchStats reports the codec's idle, in-flight and orphaned scratch
// buffers, for tests of its lifetime handling.
func (h *Half) ScratchStats() (idle, inFlight, orphans int) { return h.scratch.stats() }

// Close frees the scratch buffers and makes the codec unusable. The owner
// must have waited for the codec's stream work; buffers still in use are
// leaked and reported as an error.
func (h *Half) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	h.hot = nil
	return h.scratch.close()
}
