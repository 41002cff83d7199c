package codectest

import (
	"sync"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// BatchingOptions declare the equivalence classes and cold sizes of a
// Batching codec.
type BatchingOptions struct {
	// Classes are codec-equivalence classes: every member's batching ID is
	// the smallest member. Lifecycles in no class map to themselves.
	Classes [][]layout.LayerGroupID
	// Representative overrides the batching ID of single lifecycles after
	// Classes are applied, to build invalid declarations on purpose (a
	// representative greater than a member, one that does not map to itself,
	// an unconfigured one). Values are reported as given.
	Representative map[layout.LayerGroupID]layout.LayerGroupID
	// ColdPageBytes sets the cold-page size of single lifecycles; the default
	// is the hot page bytes. A size above the page bytes pads each cold page
	// (the padding is left untouched); a size below makes Configure fail.
	ColdPageBytes map[layout.LayerGroupID]int64
}

// Batching is the concatenating cold format (as the default codec) with
// declared batching classes and per-lifecycle cold-page sizes, and Host
// indices. Within its declarations it is self-consistent: Encode and Decode
// lay cold page c of lifecycle lg at base + c*QueryColdPageBytes(lg), using
// the hot group and cold size of the ID they are called with, so the manager
// can concatenate the pairs of a class and call once with the representative.
// Each call submits one BatchCopy with one descriptor per page and pool.
//
// Declarations are not checked against the layout, so a test can declare
// classes that the manager's construction validation must reject (members in
// different hot groups, different cold sizes). For failure values and
// different locations, wrap it in a Faulty.
type Batching struct {
	opts BatchingOptions

	mu         sync.Mutex
	hot        *codec.HotLayout
	configured bool
	closed     bool
	rep        map[layout.LayerGroupID]layout.LayerGroupID
	cold       map[layout.LayerGroupID]int64
	descs      []device.CopyDesc
}

var _ codec.ColdPageCodec = (*Batching)(nil)

// NewBatching returns a Batching codec with the given declarations.
func NewBatching(opts BatchingOptions) *Batching { return &Batching{opts: opts} }

// Configure accepts a well-formed layout whose declared cold sizes are at
// least the page bytes of their lifecycles; a second call returns false.
func (b *Batching) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.configured {
		return false
	}
	b.configured = true
	hl, err := codec.NewHotLayout(gpuDescs)
	if err != nil {
		return false
	}
	rep := map[layout.LayerGroupID]layout.LayerGroupID{}
	for _, lc := range hl.LifeCycles() {
		rep[lc] = lc
	}
	for _, class := range b.opts.Classes {
		if len(class) == 0 {
			continue
		}
		m := class[0]
		for _, lc := range class {
			m = min(m, lc)
		}
		for _, lc := range class {
			rep[lc] = m
		}
	}
	for lc, r := range b.opts.Representative {
		rep[lc] = r
	}
	cold := map[layout.LayerGroupID]int64{}
	for _, lc := range hl.LifeCycles() {
		cold[lc] = hl.PageBytes(lc)
	}
	for lc, n := range b.opts.ColdPageBytes {
		if hl.Known(lc) && n < hl.PageBytes(lc) {
			return false
		}
		cold[lc] = n
	}
	b.hot, b.rep, b.cold = hl, rep, cold
	return true
}

// QueryColdPageBytes is the declared (or default) cold size of a known lg.
func (b *Batching) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.hot.Known(lg) {
		return 0
	}
	return b.cold[lg]
}

// GetBatchingLayerGroupID is the declared representative of a known lg.
func (b *Batching) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.hot.Known(lg) {
		return -1
	}
	return b.rep[lg]
}

// QueryPageIndexLocation is Host for known lifecycles.
func (b *Batching) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.hot.Known(lg) {
		return codec.BadLocation
	}
	return codec.Host
}

// Encode writes the concatenated hot pages as cold pages of lg's stride.
func (b *Batching) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return b.transfer(lg, codec.ToCold, dstBase, idx, stream)
}

// Decode reads cold pages of lg's stride back into hot slots.
func (b *Batching) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return b.transfer(lg, codec.ToHot, srcBase, idx, stream)
}

func (b *Batching) transfer(lg layout.LayerGroupID, dir codec.Direction, coldBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || !b.hot.Known(lg) || idx.Location() != codec.Host {
		return false
	}
	pairs := idx.Host()
	if len(pairs) == 0 {
		return true
	}
	if stream == nil {
		return false
	}
	descs, err := b.hot.AppendConcatCopies(b.descs[:0], lg, dir, coldBase, b.cold[lg], pairs)
	b.descs = descs[:0]
	if err != nil {
		return false
	}
	return stream.BatchCopy(descs) == nil
}

// Close makes the codec unusable.
func (b *Batching) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.hot = nil
	return nil
}
