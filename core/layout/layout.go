// Package layout derives the physical storage layout from a configuration:
// lifecycles (layer groups) from attention-window shapes, pools from same-size
// buffers, pool groups per cache level, and slot counts from byte quotas.
//
// Every cache level has its own lifecycle→pool-group mapping. The hot level
// groups lifecycles with identical slot layouts (one slot id addresses every
// pool of the group); cold levels hold one opaque blob per page and group
// lifecycles by their encoded page size, one pool per group. Pool-group
// indices of different levels are unrelated.
package layout

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core/config"
)

// Window is the attention-window shape that defines a lifecycle. Size 0 is
// full attention. SSM marks the SSM layer group instead: one fixed-size
// state per request and no page per block (Size and Sinks are 0).
type Window struct {
	Size  int
	Sinks int
	SSM   bool
}

// BufferKey names one buffer: a layer and a role.
type BufferKey struct {
	Layer int32
	Role  config.DataRole
}

// Pool is one hot pool of a lifecycle: same-size buffers coalesced so that a
// slot holds each of them once, in Buffers order.
type Pool struct {
	BufferBytes int64
	Buffers     []BufferKey
}

// SlotBytes is the size of one slot of the pool.
func (p Pool) SlotBytes() int64 { return p.BufferBytes * int64(len(p.Buffers)) }

// LifeCycle is one layer group.
type LifeCycle struct {
	ID     LayerGroupID
	Window Window
	Layers []int32
	Pools  []Pool
	// ScratchBlocksPerSlot is the fewest blocks of one layer a scratch slot
	// holds, over the lifecycle's buffers (see BufferLocation).
	ScratchBlocksPerSlot int
}

// PageBytes is the hot size of one page: one slot in every pool.
func (lc *LifeCycle) PageBytes() int64 {
	var n int64
	for _, p := range lc.Pools {
		n += p.SlotBytes()
	}
	return n
}

// BufferLocation says where a buffer lives in the hot layout. The block of
// base page (slot) s is the buffer's page s*Scale + Offset, counted in units
// of Bytes (the buffer's bytes per block) from its pool's base address. A
// buffer with a tokens_per_block_override holds Expansion pages of its own in
// each block: kernel page indices (s*Scale + Offset)*Expansion + i for i in
// [0, Expansion), counted in units of Bytes/Expansion.
//
// ScratchPagesPerBlock is how many sub-pages of a slot of the pool one block
// of the buffer's layer takes: the layer's buffers in the pool, which sit
// side by side. A scratch slot (see ScratchBlocksPerSlot) holds
// Scale/ScratchPagesPerBlock blocks of one layer.
type BufferLocation struct {
	LifeCycle            LayerGroupID
	Pool                 int
	Scale                int64
	Offset               int64
	Bytes                int64
	Expansion            int
	ScratchPagesPerBlock int64
}

// ScratchBlocksPerSlot is how many blocks of the buffer's layer one scratch
// slot holds.
func (b BufferLocation) ScratchBlocksPerSlot() int64 { return b.Scale / b.ScratchPagesPerBlock }

// Group is one pool group of a level: its member lifecycles (ascending) and
// the slot bytes of each of its pools.
type Group struct {
	Index      PoolGroupIndex
	LifeCycles []LayerGroupID
	PoolBytes  []int64
}

// PageBytes is the size of one slot across the group's pools.
func (g *Group) PageBytes() int64 {
	var n int64
	for _, b := range g.PoolBytes {
		n += b
	}
	return n
}

// Level is the grouping of one cache level.
type Level struct {
	Kind             config.TierKind
	Groups           []Group
	LifeCycleToGroup []PoolGroupIndex
}

// GroupOf returns the pool group of lifecycle lc at this level.
func (l *Level) GroupOf(lc LayerGroupID) *Group { return &l.Groups[l.LifeCycleToGroup[lc]] }

// Layout is the derived layout of a configuration.
type Layout struct {
	TokensPerBlock int
	LifeCycles     []LifeCycle
	Buffers        map[BufferKey]BufferLocation
	// Levels has one entry per configured tier; Levels[0] is the hot level.
	// Cold levels are filled by SetColdPageBytes.
	Levels []Level
	// SSM is the SSM layer group, or -1 without SSM layers.
	SSM LayerGroupID
	// MaxSsmSlots caps the hot slots of the SSM layer group (0: no cap).
	MaxSsmSlots int64
	// HotGranularity is the size unit of every hot pool, from the GPU
	// tier's PoolGranularity (GpuPoolGranularity of its quota for
	// config.KVCM2PoolGranularity); 0: pools sized to the byte.
	HotGranularity int64
}

// IsSSM reports whether lc is the SSM layer group.
func (lt *Layout) IsSSM(lc LayerGroupID) bool { return lt.SSM >= 0 && lc == lt.SSM }

// NumLifeCycles returns the number of lifecycles (layer groups).
func NumLifeCycles(cfg *config.Config) int {
	seen := map[Window]bool{}
	for _, l := range cfg.Layers {
		seen[Window{Size: l.SlidingWindowSize, Sinks: l.NumSinkTokens}] = true
	}
	if len(cfg.SsmLayers) > 0 {
		return len(seen) + 1
	}
	return len(seen)
}

// New derives the hot layout. Lifecycle ids follow the ascending layer id of
// each window shape's first layer; pools within a lifecycle are ordered by
// descending buffer size, buffers within a pool by layer id and then by the
// role order of the layer's configuration. The SSM layer group, when there
// are SSM layers, comes after every attention layer group.
func New(cfg *config.Config) *Layout {
	layers := slices.Clone(cfg.Layers)
	slices.SortFunc(layers, func(a, b config.AttentionLayerConfig) int { return cmp.Compare(a.LayerID, b.LayerID) })

	lt := &Layout{TokensPerBlock: cfg.TokensPerBlock, Buffers: map[BufferKey]BufferLocation{}, SSM: -1,
		MaxSsmSlots: cfg.MaxSsmSlots}
	byWindow := map[Window]LayerGroupID{}
	for _, l := range layers {
		w := Window{Size: l.SlidingWindowSize, Sinks: l.NumSinkTokens}
		id, ok := byWindow[w]
		if !ok {
			id = LayerGroupID(len(lt.LifeCycles))
			byWindow[w] = id
			lt.LifeCycles = append(lt.LifeCycles, LifeCycle{ID: id, Window: w})
		}
		lt.LifeCycles[id].Layers = append(lt.LifeCycles[id].Layers, l.LayerID)
	}
	for i := range lt.LifeCycles {
		lt.buildPools(&lt.LifeCycles[i], layers)
	}
	if len(cfg.SsmLayers) > 0 {
		ssm := make([]config.AttentionLayerConfig, len(cfg.SsmLayers))
		for i, l := range cfg.SsmLayers {
			ssm[i] = config.AttentionLayerConfig{LayerID: l.LayerID, Buffers: l.Buffers}
		}
		slices.SortFunc(ssm, func(a, b config.AttentionLayerConfig) int { return cmp.Compare(a.LayerID, b.LayerID) })
		lt.SSM = LayerGroupID(len(lt.LifeCycles))
		lc := LifeCycle{ID: lt.SSM, Window: Window{SSM: true}}
		for _, l := range ssm {
			lc.Layers = append(lc.Layers, l.LayerID)
		}
		lt.LifeCycles = append(lt.LifeCycles, lc)
		lt.buildPools(&lt.LifeCycles[lt.SSM], ssm)
	}
	lt.Levels = make([]Level, len(cfg.CacheTiers))
	for i, t := range cfg.CacheTiers {
		lt.Levels[i].Kind = t.Kind
	}
	if len(cfg.CacheTiers) > 0 {
		switch hot := cfg.CacheTiers[0]; {
		case hot.PoolGranularity == config.KVCM2PoolGranularity:
			lt.HotGranularity = GpuPoolGranularity(hot.Quota)
		case hot.PoolGranularity > 0:
			lt.HotGranularity = hot.PoolGranularity
		}
	}
	lt.Levels[0] = hotLevel(lt.LifeCycles)
	return lt
}

func (lt *Layout) buildPools(lc *LifeCycle, layers []config.AttentionLayerConfig) {
	bySize := map[int64]int{}
	expansion := map[BufferKey]int{}
	for _, l := range layers {
		if !slices.Contains(lc.Layers, l.LayerID) {
			continue
		}
		for _, b := range l.Buffers {
			// A buffer is coalesced by its bytes per block: an expanded
			// buffer's pages side by side.
			e := b.Expansion(lt.TokensPerBlock)
			size := b.Size * int64(e)
			i, ok := bySize[size]
			if !ok {
				i = len(lc.Pools)
				bySize[size] = i
				lc.Pools = append(lc.Pools, Pool{BufferBytes: size})
			}
			k := BufferKey{l.LayerID, b.Role}
			lc.Pools[i].Buffers = append(lc.Pools[i].Buffers, k)
			expansion[k] = e
		}
	}
	slices.SortStableFunc(lc.Pools, func(a, b Pool) int { return cmp.Compare(b.BufferBytes, a.BufferBytes) })
	for pi, p := range lc.Pools {
		perLayer := map[int32]int64{}
		for _, k := range p.Buffers {
			perLayer[k.Layer]++
		}
		for off, k := range p.Buffers {
			loc := BufferLocation{
				LifeCycle: lc.ID, Pool: pi, Scale: int64(len(p.Buffers)), Offset: int64(off), Bytes: p.BufferBytes,
				Expansion:            expansion[k],
				ScratchPagesPerBlock: perLayer[k.Layer],
			}
			lt.Buffers[k] = loc
			if bps := int(loc.ScratchBlocksPerSlot()); lc.ScratchBlocksPerSlot == 0 || bps < lc.ScratchBlocksPerSlot {
				lc.ScratchBlocksPerSlot = bps
			}
		}
	}
}

// ScratchSlots returns how many scratch slots n scratch blocks of lifecycle
// lc take: enough for every buffer of every layer, one layer at a time (a
// slot's sub-pages hold consecutive blocks of the layer computing now).
func (lt *Layout) ScratchSlots(lc LayerGroupID, n int) int {
	if n <= 0 {
		return 0
	}
	bps := lt.LifeCycles[lc].ScratchBlocksPerSlot
	return (n + bps - 1) / bps
}

// ScratchRange returns the blocks [lo, hi) of lifecycle lc that use scratch
// slots in a step from history to capacity tokens when the last maxRewind
// tokens may be rewound: the step's new blocks, [BlocksFor(history),
// BlocksFor(capacity)), that are out of the window (past the sinks) once
// every non-rewindable token of the capacity is history. Full attention has
// none.
func (lt *Layout) ScratchRange(lc LayerGroupID, history, capacity, maxRewind int) (lo, hi int) {
	if lt.LifeCycles[lc].Window.Size == 0 {
		return 0, 0
	}
	kept := max(0, capacity-maxRewind)
	lo = max(lt.BlocksFor(history), lt.SinkBlocks(lc))
	hi = min(lt.BlocksFor(capacity), lt.FirstKeptBlock(lc, kept))
	if hi <= lo {
		return 0, 0
	}
	return lo, hi
}

// hotLevel groups lifecycles whose slot layouts (pool slot sizes in order) are
// identical; the SSM layer group keeps a pool group of its own.
func hotLevel(lcs []LifeCycle) Level {
	lvl := Level{Kind: config.GPUTier, LifeCycleToGroup: make([]PoolGroupIndex, len(lcs))}
	for i := range lcs {
		sizes := make([]int64, len(lcs[i].Pools))
		for j, p := range lcs[i].Pools {
			sizes[j] = p.SlotBytes()
		}
		g := slices.IndexFunc(lvl.Groups, func(g Group) bool {
			return slices.Equal(g.PoolBytes, sizes) && lcs[g.LifeCycles[0]].Window.SSM == lcs[i].Window.SSM
		})
		if g < 0 {
			g = len(lvl.Groups)
			lvl.Groups = append(lvl.Groups, Group{Index: PoolGroupIndex(g), PoolBytes: sizes})
		}
		lvl.Groups[g].LifeCycles = append(lvl.Groups[g].LifeCycles, lcs[i].ID)
		lvl.LifeCycleToGroup[i] = PoolGroupIndex(g)
	}
	return lvl
}

// SetColdPageBytes builds the grouping of every cold level from each
// lifecycle's encoded page size: lifecycles with equal sizes share one cold
// pool group of one pool. All cold levels share the same grouping, so blobs
// copy between them unchanged.
func (lt *Layout) SetColdPageBytes(coldBytes []int64) error {
	if len(coldBytes) != len(lt.LifeCycles) {
		return fmt.Errorf("layout: %d cold page sizes for %d lifecycles", len(coldBytes), len(lt.LifeCycles))
	}
	cold := Level{LifeCycleToGroup: make([]PoolGroupIndex, len(coldBytes))}
	for lc, n := range coldBytes {
		if n <= 0 {
			return fmt.Errorf("layout: lifecycle %d has cold page size %d", lc, n)
		}
		g := slices.IndexFunc(cold.Groups, func(g Group) bool { return g.PoolBytes[0] == n })
		if g < 0 {
			g = len(cold.Groups)
			cold.Groups = append(cold.Groups, Group{Index: PoolGroupIndex(g), PoolBytes: []int64{n}})
		}
		cold.Groups[g].LifeCycles = append(cold.Groups[g].LifeCycles, LayerGroupID(lc))
		cold.LifeCycleToGroup[lc] = PoolGroupIndex(g)
	}
	for i := 1; i < len(lt.Levels); i++ {
		kind := lt.Levels[i].Kind
		lt.Levels[i] = cold
		lt.Levels[i].Kind = kind
		lt.Levels[i].Groups = slices.Clone(cold.Groups)
	}
	return nil
}

// BlocksFor returns how many blocks a sequence of n tokens spans.
func (lt *Layout) BlocksFor(n int) int {
	b := n / lt.TokensPerBlock
	if n%lt.TokensPerBlock != 0 {
		b++
	}
	return b
}

// NewPagesNeeded returns how many of blocks [from, to) lifecycle lc needs
// once history tokens are computed: the sink blocks and those from the first
// kept one on.
func (lt *Layout) NewPagesNeeded(lc LayerGroupID, from, to, history int) int {
	if lt.IsSSM(lc) {
		return 0 // the state is per request, not per block
	}
	overlap := func(lo, hi int) int { return max(0, min(hi, to)-max(lo, from)) }
	sinks := lt.SinkBlocks(lc)
	return overlap(0, sinks) + overlap(max(sinks, lt.FirstKeptBlock(lc, history)), to)
}

// SinkBlocks returns how many leading blocks hold sink tokens of lifecycle lc.
func (lt *Layout) SinkBlocks(lc LayerGroupID) int {
	return lt.BlocksFor(lt.LifeCycles[lc].Window.Sinks)
}

// FirstKeptBlock returns the first non-sink block lifecycle lc still needs
// once history tokens are computed: the token at the first uncomputed
// position attends to the window size of tokens ending at itself, from
// position history+1-window on (KVCacheManagerV2's stale range). The SSM
// layer group keeps no block: every computed block is behind its state.
func (lt *Layout) FirstKeptBlock(lc LayerGroupID, history int) int {
	if lt.IsSSM(lc) {
		return history / lt.TokensPerBlock
	}
	w := lt.LifeCycles[lc].Window.Size
	if w == 0 || history+1 <= w {
		return 0
	}
	return (history + 1 - w) / lt.TokensPerBlock
}

// Needs reports whether lifecycle lc needs block b of a sequence whose first
// history tokens are computed.
func (lt *Layout) Needs(lc LayerGroupID, b, history int) bool {
	if lt.IsSSM(lc) {
		return false
	}
	if lt.LifeCycles[lc].Window.Size == 0 {
		return true // full attention
	}
	return b < lt.SinkBlocks(lc) || b >= lt.FirstKeptBlock(lc, history)
}

// PagesNeeded returns the pages lifecycle lc holds for one request: one state
// in the SSM layer group.
func (lt *Layout) PagesNeeded(lc LayerGroupID, r config.RequestDesc) int64 {
	if lt.IsSSM(lc) {
		return 1
	}
	total := lt.BlocksFor(r.Capacity)
	first := min(lt.FirstKeptBlock(lc, r.HistoryLength), total)
	sinks := min(lt.SinkBlocks(lc), first)
	return int64(total - first + sinks)
}
