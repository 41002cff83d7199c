package codec

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// ErrBadLayout is wrapped by every error NewHotLayout returns.
var ErrBadLayout = errors.New("codec: ill-formed hot pool-group descriptors")

// ErrBadIndex is wrapped by every index error of AppendConcatCopies.
var ErrBadIndex = errors.New("codec: page index out of range")

// HotLayout is a validated, private copy of the hot pool-group descriptors a
// codec receives in Configure, with the lookups codecs need. It is immutable
// after NewHotLayout and safe for concurrent reads.
//
// Embedding a *HotLayout in a codec gives it the default
// GetBatchingLayerGroupID (identity for known lifecycles); its methods accept a
// nil receiver and then answer as for an unconfigured codec.
type HotLayout struct {
	groups []layout.PoolGroupDesc
	byLC   map[layout.LayerGroupID]int
	lcs    []layout.LayerGroupID
}

// NewHotLayout validates descs as the design requires of Configure's argument
// and copies them. It fails (wrapping ErrBadLayout) on: no descriptors; a
// descriptor whose Index is not its position; a group with no slots, no pools
// or no lifecycles; a pool with a zero base or non-positive SlotBytes; a
// negative lifecycle, lifecycles not strictly ascending within a group, or a
// lifecycle listed in two groups; sizes or addresses that overflow.
func NewHotLayout(descs []layout.PoolGroupDesc) (*HotLayout, error) {
	if len(descs) == 0 {
		return nil, fmt.Errorf("%w: no pool groups", ErrBadLayout)
	}
	h := &HotLayout{
		groups: make([]layout.PoolGroupDesc, len(descs)),
		byLC:   make(map[layout.LayerGroupID]int),
	}
	for i, d := range descs {
		if d.Index != layout.PoolGroupIndex(i) {
			return nil, fmt.Errorf("%w: descriptor %d has index %d", ErrBadLayout, i, d.Index)
		}
		if d.NumSlots <= 0 {
			return nil, fmt.Errorf("%w: pool group %d has %d slots", ErrBadLayout, i, d.NumSlots)
		}
		if len(d.Pools) == 0 {
			return nil, fmt.Errorf("%w: pool group %d has no pools", ErrBadLayout, i)
		}
		if len(d.LifeCycles) == 0 {
			return nil, fmt.Errorf("%w: pool group %d holds no lifecycle", ErrBadLayout, i)
		}
		var page int64
		for j, p := range d.Pools {
			if p.SlotBytes <= 0 {
				return nil, fmt.Errorf("%w: pool group %d pool %d has %d slot bytes", ErrBadLayout, i, j, p.SlotBytes)
			}
			if p.Base == 0 {
				return nil, fmt.Errorf("%w: pool group %d pool %d has a null base", ErrBadLayout, i, j)
			}
			if p.SlotBytes > math.MaxInt64/d.NumSlots {
				return nil, fmt.Errorf("%w: pool group %d pool %d size overflows", ErrBadLayout, i, j)
			}
			if uint64(p.Base) > math.MaxUint64-uint64(p.SlotBytes*d.NumSlots) {
				return nil, fmt.Errorf("%w: pool group %d pool %d address range overflows", ErrBadLayout, i, j)
			}
			if page > math.MaxInt64-p.SlotBytes {
				return nil, fmt.Errorf("%w: pool group %d page size overflows", ErrBadLayout, i)
			}
			page += p.SlotBytes
		}
		for k, lc := range d.LifeCycles {
			if lc < 0 {
				return nil, fmt.Errorf("%w: pool group %d lists negative lifecycle %d", ErrBadLayout, i, lc)
			}
			if k > 0 && lc <= d.LifeCycles[k-1] {
				return nil, fmt.Errorf("%w: pool group %d lifecycles are not strictly ascending", ErrBadLayout, i)
			}
			if g, dup := h.byLC[lc]; dup {
				return nil, fmt.Errorf("%w: lifecycle %d is listed in pool groups %d and %d", ErrBadLayout, lc, g, i)
			}
			h.byLC[lc] = i
			h.lcs = append(h.lcs, lc)
		}
		h.groups[i] = layout.PoolGroupDesc{
			Index:      d.Index,
			NumSlots:   d.NumSlots,
			LifeCycles: slices.Clone(d.LifeCycles),
			Pools:      slices.Clone(d.Pools),
		}
	}
	slices.Sort(h.lcs)
	return h, nil
}

// Groups returns the pool groups, ordered by index. Callers must not modify
// them.
func (h *HotLayout) Groups() []layout.PoolGroupDesc {
	if h == nil {
		return nil
	}
	return h.groups
}

// LifeCycles returns every configured lifecycle in ascending order. Callers
// must not modify it.
func (h *HotLayout) LifeCycles() []layout.LayerGroupID {
	if h == nil {
		return nil
	}
	return h.lcs
}

// Known reports whether lg belongs to a configured pool group.
func (h *HotLayout) Known(lg layout.LayerGroupID) bool {
	if h == nil {
		return false
	}
	_, ok := h.byLC[lg]
	return ok
}

// GroupOf returns lg's hot pool group, or nil for an unknown lifecycle.
// Callers must not modify it.
func (h *HotLayout) GroupOf(lg layout.LayerGroupID) *layout.PoolGroupDesc {
	if h == nil {
		return nil
	}
	i, ok := h.byLC[lg]
	if !ok {
		return nil
	}
	return &h.groups[i]
}

// PageBytes is the hot page size of lg (the sum of its group's SlotBytes), or
// 0 for an unknown lifecycle.
func (h *HotLayout) PageBytes(lg layout.LayerGroupID) int64 {
	g := h.GroupOf(lg)
	if g == nil {
		return 0
	}
	return g.PageBytes()
}

// GetBatchingLayerGroupID is the design's default: lg itself for a known
// lifecycle, which disables cross-lifecycle batching, and -1 otherwise.
func (h *HotLayout) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	if !h.Known(lg) {
		return -1
	}
	return lg
}

// Direction is the direction of a hot/cold transfer.
type Direction int

const (
	// ToCold encodes: pair.Src is a hot slot, pair.Dst a cold page.
	ToCold Direction = iota
	// ToHot decodes: pair.Src is a cold page, pair.Dst a hot slot.
	ToHot
)

func (d Direction) String() string {
	switch d {
	case ToCold:
		return "to-cold"
	case ToHot:
		return "to-hot"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// AppendConcatCopies appends to descs the copies of the concatenating cold
// format: for each pair in order and, within a page, for each pool of lg's hot
// group in pool order, one descriptor moving that pool's SlotBytes between the
// hot slot and its offset in the cold page. Cold page c starts at coldBase +
// c*coldStride and holds the pools' slot bytes back to back from its start;
// coldStride must be at least the page bytes (bytes beyond them are left
// untouched). The result has len(pairs)*len(pools) new descriptors.
//
// It validates everything before the caller submits anything: lg known, a
// non-zero coldBase (unless pairs is empty), hot indices in [0, NumSlots),
// cold indices non-negative and addresses without overflow. On error it
// returns descs truncated to its original length and an error wrapping
// ErrBadIndex or ErrBadLayout.
func (h *HotLayout) AppendConcatCopies(descs []device.CopyDesc, lg layout.LayerGroupID, dir Direction,
	coldBase device.Ptr, coldStride int64, pairs []PageIndexPair) ([]device.CopyDesc, error) {
	g := h.GroupOf(lg)
	if g == nil {
		return descs, fmt.Errorf("%w: unknown lifecycle %d", ErrBadLayout, lg)
	}
	if dir != ToCold && dir != ToHot {
		return descs, fmt.Errorf("codec: invalid direction %d", int(dir))
	}
	if len(pairs) == 0 {
		return descs, nil
	}
	page := g.PageBytes()
	if coldStride < page {
		return descs, fmt.Errorf("%w: cold stride %d is below the page bytes %d of lifecycle %d", ErrBadLayout, coldStride, page, lg)
	}
	if coldBase == 0 {
		return descs, fmt.Errorf("%w: null cold base", ErrBadIndex)
	}
	// Largest cold index whose page [coldBase+c*stride, +stride) neither
	// overflows int64 offsets nor the address space.
	maxCold := (math.MaxInt64 - coldStride) / coldStride
	if room := (math.MaxUint64 - uint64(coldBase) - uint64(coldStride)) / uint64(coldStride); uint64(coldBase) > math.MaxUint64-uint64(coldStride) {
		maxCold = -1
	} else if room < uint64(maxCold) {
		maxCold = int64(room)
	}
	orig := len(descs)
	descs = slices.Grow(descs, len(pairs)*len(g.Pools))
	for i, p := range pairs {
		hot, cold := p.Src, p.Dst
		if dir == ToHot {
			hot, cold = p.Dst, p.Src
		}
		if hot < 0 || int64(hot) >= g.NumSlots {
			return descs[:orig], fmt.Errorf("%w: pair %d: hot slot %d of lifecycle %d outside [0, %d)", ErrBadIndex, i, hot, lg, g.NumSlots)
		}
		if cold < 0 || int64(cold) > maxCold {
			return descs[:orig], fmt.Errorf("%w: pair %d: cold page %d is negative or its address overflows", ErrBadIndex, i, cold)
		}
		cp := coldBase.Add(int64(cold) * coldStride)
		for _, pool := range g.Pools {
			hp := pool.Base.Add(int64(hot) * pool.SlotBytes)
			if dir == ToCold {
				descs = append(descs, device.CopyDesc{Dst: cp, Src: hp, Size: pool.SlotBytes})
			} else {
				descs = append(descs, device.CopyDesc{Dst: hp, Src: cp, Size: pool.SlotBytes})
			}
			cp = cp.Add(pool.SlotBytes)
		}
	}
	return descs, nil
}
