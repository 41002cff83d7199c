package layout

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/kvcm/kvcm/core/config"
)

// ByteWeights derives one positive hot-tier byte weight per lifecycle (layer
// group), normalized to sum to 1: from InitialPoolRatio, else from the pages a
// typical step needs, else from the largest constraint, else equal slot counts.
func (lt *Layout) ByteWeights(cfg *config.Config) []float64 {
	w := make([]float64, len(lt.LifeCycles))
	switch {
	case len(cfg.InitialPoolRatio) > 0:
		copy(w, cfg.InitialPoolRatio) // validated positive
	case cfg.TypicalStep != nil:
		w = lt.atLeastOnePage(lt.batchBytes(*cfg.TypicalStep))
	case len(cfg.Constraints) > 0:
		for _, b := range cfg.Constraints {
			for i, x := range lt.batchBytes(b) {
				w[i] = max(w[i], x)
			}
		}
		w = lt.atLeastOnePage(w)
	default:
		for i := range lt.LifeCycles {
			w[i] = float64(lt.LifeCycles[i].PageBytes())
		}
	}
	var sum float64
	for _, x := range w {
		sum += x
	}
	for i := range w {
		w[i] /= sum
	}
	return w
}

// atLeastOnePage raises byte weights to one page: a lifecycle a batch never
// touches still needs room to exist.
func (lt *Layout) atLeastOnePage(w []float64) []float64 {
	for i := range w {
		w[i] = max(w[i], float64(lt.LifeCycles[i].PageBytes()))
	}
	return w
}

func (lt *Layout) batchBytes(b config.BatchDesc) []float64 {
	w := make([]float64, len(lt.LifeCycles))
	for i := range lt.LifeCycles {
		w[i] = float64(lt.BatchPages(LayerGroupID(i), b)) * float64(lt.LifeCycles[i].PageBytes())
	}
	return w
}

// BatchPages returns the pages lifecycle lc holds for batch b. The full
// blocks of the system prompt (the first SystemPromptLength tokens, shared
// by every request, as far as the shortest request holds them) are pages of
// the reuse tree that every request holding them shares: they count once,
// as the union of the shared blocks the requests still need, and every
// request's other pages count for it alone. The sum saturates. In the SSM
// layer group every request holds one state.
func (lt *Layout) BatchPages(lc LayerGroupID, b config.BatchDesc) int64 {
	if lt.IsSSM(lc) {
		return int64(len(b.Requests))
	}
	shared := 0
	if len(b.Requests) > 0 && b.SystemPromptLength > 0 {
		shortest := b.Requests[0].Capacity
		for _, r := range b.Requests[1:] {
			shortest = min(shortest, r.Capacity)
		}
		shared = min(b.SystemPromptLength, shortest) / lt.TokensPerBlock
	}
	var n int64
	firstKept := shared // the earliest non-sink shared block any request keeps
	for _, r := range b.Requests {
		held := 0
		if shared > 0 {
			held = lt.NewPagesNeeded(lc, 0, shared, r.HistoryLength)
			firstKept = min(firstKept, max(lt.SinkBlocks(lc), lt.FirstKeptBlock(lc, r.HistoryLength)))
		}
		n = addSaturating(n, lt.PagesNeeded(lc, r)-int64(held))
	}
	if shared > 0 {
		sinks := min(lt.SinkBlocks(lc), shared)
		n = addSaturating(n, int64(sinks+max(shared-max(firstKept, sinks), 0)))
	}
	return n
}

// HotFloors returns, per lifecycle, the slots the largest constraint batch
// needs on the hot level.
func (lt *Layout) HotFloors(cfg *config.Config) []int64 {
	floors := make([]int64, len(lt.LifeCycles))
	for _, b := range cfg.Constraints {
		for i := range lt.LifeCycles {
			// Saturated: an overflowing floor fails as "floors overflow".
			floors[i] = max(floors[i], lt.BatchPages(LayerGroupID(i), b))
		}
	}
	return floors
}

// HotSlots sizes every hot pool group from the quota: each group gets the byte
// weights of its lifecycles, then groups below their constraint floors are
// raised to them and the rest is shared again by weight. It fails when the
// floors (or one slot per group) do not fit in the quota, or when a group
// would get more than MaxSlots slots. The slots of all groups together never
// take more than quota bytes. With MaxSsmSlots, the SSM layer group's pool
// group gets at most that many slots (at least its floor) and the bytes it
// leaves are shared among the others (the manager refuses a cap below the
// group's floor).
func (lt *Layout) HotSlots(quota int64, weights []float64, floors []int64) ([]int64, error) {
	lvl := &lt.Levels[0]
	gw := make([]float64, len(lvl.Groups))
	gfloor := make([]int64, len(lvl.Groups))
	for lc, g := range lvl.LifeCycleToGroup {
		gw[g] += weights[lc]
		gfloor[g] += floors[lc]
	}
	for g := range gfloor {
		gfloor[g] = max(gfloor[g], 1)
	}
	slots, err := shareQuota("gpu", quota, lvl.Groups, gw, gfloor)
	if err != nil || lt.SSM < 0 || lt.MaxSsmSlots == 0 || len(lvl.Groups) == 1 {
		return slots, err
	}
	sg := lvl.LifeCycleToGroup[lt.SSM]
	capped := max(lt.MaxSsmSlots, gfloor[sg])
	if slots[sg] <= capped {
		return slots, nil
	}
	// The capped group is pinned; the others share what it leaves.
	var others []Group
	var ow []float64
	var of []int64
	for g := range lvl.Groups {
		if PoolGroupIndex(g) != sg {
			others, ow, of = append(others, lvl.Groups[g]), append(ow, gw[g]), append(of, gfloor[g])
		}
	}
	rest, err := shareQuota("gpu", quota-capped*lvl.Groups[sg].PageBytes(), others, ow, of)
	if err != nil {
		return nil, err
	}
	out := make([]int64, 0, len(lvl.Groups))
	for g := range lvl.Groups {
		if PoolGroupIndex(g) == sg {
			out = append(out, capped)
		} else {
			out, rest = append(out, rest[0]), rest[1:]
		}
	}
	return out, nil
}

// ColdSlots sizes the pool groups of cold level lvl. Each lifecycle's hot byte
// weight becomes a slot-count weight through its hot page size, then cold
// bytes through its cold page size, so layer-group slot proportions survive a
// change of page size or grouping. Cold groups get only the structural minimum
// of one slot; constraint floors never apply here.
func (lt *Layout) ColdSlots(level int, quota int64, weights []float64) ([]int64, error) {
	lvl := &lt.Levels[level]
	gw := make([]float64, len(lvl.Groups))
	for lc, g := range lvl.LifeCycleToGroup {
		slotWeight := weights[lc] / float64(lt.LifeCycles[lc].PageBytes())
		gw[g] += slotWeight * float64(lvl.Groups[g].PageBytes())
	}
	var sum float64
	for _, x := range gw {
		sum += x
	}
	floors := make([]int64, len(gw))
	for g := range gw {
		gw[g] /= sum
		floors[g] = 1
	}
	return shareQuota(lvl.Kind.String(), quota, lvl.Groups, gw, floors)
}

// MaxSlots is the most slots a pool group can have: slots and base page
// indices are int32.
const MaxSlots = math.MaxInt32

// shareQuota shares quota among groups by weight, each group getting at least
// its floor. Every product of slots and bytes is checked, and the result
// satisfies sum(slots[g] * PageBytes(g)) <= quota and slots[g] <= MaxSlots.
func shareQuota(tier string, quota int64, groups []Group, weights []float64, floors []int64) ([]int64, error) {
	var need int64
	for g := range groups {
		b, ok := CheckedMul(floors[g], groups[g].PageBytes())
		if !ok || need+b < need {
			return nil, fmt.Errorf("layout: %s floors overflow", tier)
		}
		need += b
	}
	if need > quota {
		return nil, fmt.Errorf("layout: %s quota %d bytes is below the %d bytes its minimum slots need", tier, quota, need)
	}
	slots := make([]int64, len(groups))
	want := make([]float64, len(groups)) // slots by weight, before the int conversion
	pinned := make([]bool, len(groups))
	for {
		budget, wsum := quota, 0.0 // budget: exact, as pinned floors fit (need <= quota)
		for g := range groups {
			if pinned[g] {
				budget -= floors[g] * groups[g].PageBytes()
			} else {
				wsum += weights[g]
			}
		}
		raised := false
		for g := range groups {
			if pinned[g] {
				slots[g] = floors[g]
				continue
			}
			want[g] = math.Floor(float64(budget) * weights[g] / wsum / float64(groups[g].PageBytes()))
			// Clamped: converting a float beyond int64 is undefined.
			slots[g] = int64(min(want[g], MaxSlots+1))
			if slots[g] < floors[g] {
				pinned[g], raised = true, true
			}
		}
		if !raised {
			break
		}
	}
	for g := range groups {
		switch {
		case pinned[g] && slots[g] > MaxSlots:
			return nil, fmt.Errorf("layout: %s pool group %d needs %d slots, more than the %d a pool group can index",
				tier, groups[g].Index, slots[g], MaxSlots)
		case !pinned[g] && want[g] > MaxSlots:
			return nil, fmt.Errorf("layout: %s quota %d bytes gives pool group %d %.0f slots of %d bytes, more than the %d a pool group can index",
				tier, quota, groups[g].Index, want[g], groups[g].PageBytes(), MaxSlots)
		}
	}
	trimToQuota(quota, groups, slots, floors)
	return slots, nil
}

// trimToQuota takes slots back, from the group whose slots take the most
// bytes, until all of them fit in quota: floating-point rounding may have
// handed out one slot too many. Floors always fit, so it stops.
func trimToQuota(quota int64, groups []Group, slots, floors []int64) {
	for {
		var total int64
		fits, big := true, -1
		var bigBytes int64
		for g := range groups {
			b, ok := CheckedMul(slots[g], groups[g].PageBytes())
			if !ok || total+b < total {
				fits = false
				b = math.MaxInt64
			} else {
				total += b
			}
			if slots[g] > floors[g] && (big < 0 || b > bigBytes) {
				big, bigBytes = g, b
			}
		}
		if fits && total <= quota || big < 0 {
			return
		}
		slots[big]--
	}
}

// CheckedMul returns a*b for non-negative a and b, and whether it fits an
// int64.
func CheckedMul(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

func addSaturating(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
