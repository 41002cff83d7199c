package layout

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/kvcm/kvcm/core/config"
)

// ByteWeights derives one positive hot-tier byte weight per lifecycle (layer
// group), normalized to sum to 1: from InitialPoolRatio, else from the pages a
// typical step needs (at least one per lifecycle; with a HotGranularity, the
// bytes of each pool group's pages rounded to whole granules in every pool,
// as KVCacheManagerV2 sizes a typical step: grainWeights), else from the
// slots the constraints need (ConstraintSlots), else equal slot counts.
func (lt *Layout) ByteWeights(cfg *config.Config) []float64 {
	w := make([]float64, len(lt.LifeCycles))
	switch {
	case len(cfg.InitialPoolRatio) > 0:
		copy(w, cfg.InitialPoolRatio) // validated positive
	case cfg.TypicalStep != nil && lt.HotGranularity > 0:
		pages := make([]int64, len(lt.LifeCycles))
		for i := range lt.LifeCycles {
			pages[i] = max(lt.BatchPages(LayerGroupID(i), *cfg.TypicalStep, cfg.SwaScratchReuse), 1)
		}
		w = lt.grainWeights(pages)
	case cfg.TypicalStep != nil:
		w = lt.atLeastOnePage(lt.batchBytes(*cfg.TypicalStep, cfg.SwaScratchReuse))
	case len(cfg.Constraints) > 0:
		for i, n := range lt.ConstraintSlots(cfg) {
			w[i] = float64(n) * float64(lt.LifeCycles[i].PageBytes())
		}
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

// grainWeights returns the hot byte weights of pages slots per lifecycle
// (each at least 1) as KVCacheManagerV2 converts a batch's slots to bytes:
// each hot pool group takes its lifecycles' slots summed, every pool of it
// rounded up to whole granules (poolGrains), and the group's bytes are its
// lifecycles' weights in proportion to their slots.
func (lt *Layout) grainWeights(pages []int64) []float64 {
	lvl := &lt.Levels[0]
	slots := make([]int64, len(lvl.Groups))
	for lc, g := range lvl.LifeCycleToGroup {
		slots[g] = addSaturating(slots[g], pages[lc])
	}
	w := make([]float64, len(pages))
	for lc, g := range lvl.LifeCycleToGroup {
		grains := float64(lt.poolGrains(&lvl.Groups[g], slots[g]))
		w[lc] = grains * float64(lt.HotGranularity) * float64(pages[lc]) / float64(slots[g])
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

func (lt *Layout) batchBytes(b config.BatchDesc, scratch *config.SwaScratchReuseConfig) []float64 {
	w := make([]float64, len(lt.LifeCycles))
	for i := range lt.LifeCycles {
		w[i] = float64(lt.BatchPages(LayerGroupID(i), b, scratch)) * float64(lt.LifeCycles[i].PageBytes())
	}
	return w
}

// BatchPages returns the pages lifecycle lc holds for batch b. The full
// blocks of the system prompt (the first SystemPromptLength tokens, shared
// by every request, as far as the shortest request holds them) are pages of
// the reuse tree that every request holding them shares: they count once,
// as the union of the shared blocks the requests still need, and every
// request's other pages count for it alone. With SWA scratch reuse
// (scratch not nil) a request's scratch blocks (ScratchRange) count as the
// scratch slots they share (ScratchSlots), as KVCacheManagerV2 counts them.
// The sum saturates. In the SSM layer group every request holds one state.
func (lt *Layout) BatchPages(lc LayerGroupID, b config.BatchDesc, scratch *config.SwaScratchReuseConfig) int64 {
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
		pages := lt.PagesNeeded(lc, r) - int64(held)
		if scratch != nil {
			lo, hi := lt.ScratchRange(lc, r.HistoryLength, r.Capacity, scratch.MaxRewindLen)
			pages -= int64(hi - lo - lt.ScratchSlots(lc, hi-lo))
		}
		n = addSaturating(n, pages)
	}
	if shared > 0 {
		sinks := min(lt.SinkBlocks(lc), shared)
		n = addSaturating(n, int64(sinks+max(shared-max(firstKept, sinks), 0)))
	}
	return n
}

// StructuralFloor returns the hot slots lifecycle lc needs whatever the
// batch, as KVCacheManagerV2 floors them: one SSM state; for a sliding
// window its sink blocks and the blocks a window spans while it slides
// (sinks + (window + tpb - 2) / tpb + 1); for full attention the largest
// sliding-window floor of the layout (every layer group sees the same
// sequence), at least one.
func (lt *Layout) StructuralFloor(lc LayerGroupID) int64 {
	if lt.IsSSM(lc) {
		return 1
	}
	if lt.LifeCycles[lc].Window.Size > 0 {
		return lt.windowFloor(lc)
	}
	floor := int64(1)
	for i := range lt.LifeCycles {
		if id := LayerGroupID(i); !lt.IsSSM(id) && lt.LifeCycles[i].Window.Size > 0 {
			floor = max(floor, lt.windowFloor(id))
		}
	}
	return floor
}

func (lt *Layout) windowFloor(lc LayerGroupID) int64 {
	tpb := lt.TokensPerBlock
	return int64(lt.SinkBlocks(lc) + (lt.LifeCycles[lc].Window.Size+tpb-2)/tpb + 1)
}

// needsHeadroom reports whether hot pool group g holds a lifecycle whose
// pages grow with the sequence (any but the SSM layer group): resume refuses
// such a group above MaxUtilForResume, so its constraint floors leave room
// for that.
func (lt *Layout) needsHeadroom(g PoolGroupIndex) bool {
	for lc, pg := range lt.Levels[0].LifeCycleToGroup {
		if pg == g && !lt.IsSSM(LayerGroupID(lc)) {
			return true
		}
	}
	return false
}

// constraintShare scales n slots a constraint batch takes in hot pool group g
// up to the slots that hold them under the resume gate: n / MaxUtilForResume,
// rounded up, where the group needs headroom; n otherwise.
func (lt *Layout) constraintShare(cfg *config.Config, g PoolGroupIndex, n int64) int64 {
	if !lt.needsHeadroom(g) || n == math.MaxInt64 {
		return n
	}
	return int64(math.Ceil(float64(n) / cfg.MaxUtil()))
}

// ConstraintSlots returns, per lifecycle, the hot slots the constraints need:
// its StructuralFloor, raised to every constraint batch's pages
// (BatchPages) scaled by constraintShare.
func (lt *Layout) ConstraintSlots(cfg *config.Config) []int64 {
	slots := make([]int64, len(lt.LifeCycles))
	for i := range lt.LifeCycles {
		slots[i] = lt.StructuralFloor(LayerGroupID(i))
	}
	for _, b := range cfg.Constraints {
		for i := range lt.LifeCycles {
			g := lt.Levels[0].LifeCycleToGroup[i]
			slots[i] = max(slots[i], lt.constraintShare(cfg, g, lt.BatchPages(LayerGroupID(i), b, cfg.SwaScratchReuse)))
		}
	}
	return slots
}

// HotFloors returns, per hot pool group, the fewest slots it gets
// (KVCacheManagerV2's minimum slots): the StructuralFloor of each of its
// lifecycles summed, raised to every constraint batch's pages in the group
// scaled by constraintShare. Saturated: an overflowing floor fails in
// HotSlots as "floors overflow".
func (lt *Layout) HotFloors(cfg *config.Config) []int64 {
	lvl := &lt.Levels[0]
	floors := make([]int64, len(lvl.Groups))
	for lc, g := range lvl.LifeCycleToGroup {
		floors[g] = addSaturating(floors[g], lt.StructuralFloor(LayerGroupID(lc)))
	}
	for _, b := range cfg.Constraints {
		pages := make([]int64, len(lvl.Groups))
		for lc, g := range lvl.LifeCycleToGroup {
			pages[g] = addSaturating(pages[g], lt.BatchPages(LayerGroupID(lc), b, cfg.SwaScratchReuse))
		}
		for g := range floors {
			floors[g] = max(floors[g], lt.constraintShare(cfg, PoolGroupIndex(g), pages[g]))
		}
	}
	return floors
}

// GpuPoolGranularity returns the size unit of the hot pools for a GPU quota,
// KVCacheManagerV2's physical-page granularity: 2 MiB, doubled for every
// doubling of the quota from 1 GiB on, at most 32 MiB (from 16 GiB on).
func GpuPoolGranularity(quota int64) int64 {
	const page = 2 << 20
	shift := bits.Len64(uint64(max(quota, 0))>>30) - 1
	return page << min(4, max(0, shift))
}

// poolGrains returns the granules n slots of group g take: each pool of the
// group rounded up to whole granules on its own. Saturated.
func (lt *Layout) poolGrains(g *Group, n int64) int64 {
	gran := lt.HotGranularity
	var grains int64
	for _, b := range g.PoolBytes {
		bytes, ok := CheckedMul(n, b)
		if !ok {
			return math.MaxInt64
		}
		grains = addSaturating(grains, (bytes+gran-1)/gran)
	}
	return grains
}

// slotsIn returns the most slots group g can have in grains granules.
func (lt *Layout) slotsIn(g *Group, grains int64) int64 {
	// Every pool rounds up by less than a granule, so the answer lies in
	// [(grains-pools)*gran/pageBytes, grains*gran/pageBytes].
	pb := g.PageBytes()
	hi := bigMulDiv(grains, lt.HotGranularity, pb)
	lo := bigMulDiv(max(grains-int64(len(g.PoolBytes)), 0), lt.HotGranularity, pb)
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if lt.poolGrains(g, mid) <= grains {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// bigMulDiv returns a*b/c for non-negative a, b and positive c, saturated.
func bigMulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}

// FloorBytes returns the bytes the hot pool groups' floors take, each pool
// rounded up to HotGranularity when it is set (the least quota HotSlots
// accepts), saturated.
func (lt *Layout) FloorBytes(floors []int64) int64 {
	if lt.HotGranularity == 0 {
		var need int64
		for g, gl := range lt.Levels[0].Groups {
			b, ok := CheckedMul(floors[g], gl.PageBytes())
			if !ok {
				return math.MaxInt64
			}
			need = addSaturating(need, b)
		}
		return need
	}
	var grains int64
	for g := range lt.Levels[0].Groups {
		grains = addSaturating(grains, lt.poolGrains(&lt.Levels[0].Groups[g], floors[g]))
	}
	if b, ok := CheckedMul(grains, lt.HotGranularity); ok {
		return b
	}
	return math.MaxInt64
}

// HotQuota returns the bytes the hot pools take for a configured quota: the
// quota rounded up to HotGranularity, raised to the floors' FloorBytes, as
// KVCacheManagerV2 raises a quota to its minimum.
func (lt *Layout) HotQuota(quota int64, floors []int64) int64 {
	return max(lt.roundToGranule(quota), lt.FloorBytes(floors))
}

// roundToGranule rounds quota up to HotGranularity (down where that
// overflows); without a granule it is the quota.
func (lt *Layout) roundToGranule(quota int64) int64 {
	gran := lt.HotGranularity
	if gran == 0 {
		return quota
	}
	rounded := quota / gran * gran
	if rounded < quota && rounded <= math.MaxInt64-gran {
		rounded += gran
	}
	return rounded
}

// HotSlots sizes every hot pool group from the quota. With a HotGranularity
// it does as KVCacheManagerV2 does, in granules: the quota is rounded up to
// the granule; each pool of
// a group is a whole number of granules, and a group has the most slots its
// granules hold. The granules are shared by the byte weights of the groups'
// lifecycles, the groups of smaller weight first, each getting its share of
// what the ones before it left (rounded half to even); a group that gets no
// more than its floor (HotFloors, one per pool group) is pinned at the
// granules of its floor and the rest is shared again among the others. It
// fails when the floors overflow or a group would get more than MaxSlots
// slots, or when the floors' FloorBytes exceed the quota. Without a
// granule, see hotSlotsExact. With MaxSsmSlots, the SSM layer group's pool
// group gets at most that many slots (at least its floor) and the bytes it
// leaves are shared among the others (the manager refuses a cap below the
// group's floor).
func (lt *Layout) HotSlots(quota int64, weights []float64, floors []int64) ([]int64, error) {
	if lt.HotGranularity == 0 {
		return lt.hotSlotsExact(quota, weights, floors)
	}
	lvl := &lt.Levels[0]
	gw := make([]float64, len(lvl.Groups))
	for lc, g := range lvl.LifeCycleToGroup {
		gw[g] += weights[lc]
	}
	gfloor := make([]int64, len(lvl.Groups))
	for g := range gfloor {
		gfloor[g] = max(floors[g], 1)
	}
	need := lt.FloorBytes(gfloor)
	quota = lt.roundToGranule(quota)
	switch {
	case need == math.MaxInt64:
		return nil, fmt.Errorf("layout: gpu floors overflow")
	case need > quota:
		return nil, fmt.Errorf("layout: gpu quota %d bytes is below the %d bytes its minimum slots need", quota, need)
	}
	grains := quota / lt.HotGranularity
	all := make([]int, len(lvl.Groups))
	for g := range all {
		all[g] = g
	}
	slots := make([]int64, len(lvl.Groups))
	if err := lt.shareGrains(grains, all, gw, gfloor, slots); err != nil {
		return nil, err
	}
	if lt.SSM < 0 || lt.MaxSsmSlots == 0 || len(lvl.Groups) == 1 {
		return slots, nil
	}
	sg := int(lvl.LifeCycleToGroup[lt.SSM])
	capped := max(lt.MaxSsmSlots, gfloor[sg])
	if slots[sg] <= capped {
		return slots, nil
	}
	// The capped group is pinned; the others share what it leaves.
	slots[sg] = capped
	others := slices.DeleteFunc(all, func(g int) bool { return g == sg })
	if err := lt.shareGrains(grains-lt.poolGrains(&lvl.Groups[sg], capped), others, gw, gfloor, slots); err != nil {
		return nil, err
	}
	return slots, nil
}

// shareGrains shares grains granules among the hot groups named by active,
// by weight, each at least its floor, writing their slots into slots. The
// floors of active fit in grains.
func (lt *Layout) shareGrains(grains int64, active []int, weights []float64, floors, slots []int64) error {
	groups := lt.Levels[0].Groups
	active = slices.Clone(active)
	for len(active) > 0 {
		order := slices.Clone(active)
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(weights[a], weights[b]) })
		var rest float64
		for _, g := range order {
			rest += weights[g]
		}
		budget := grains
		for _, g := range order {
			share := min(math.RoundToEven(float64(budget)*weights[g]/rest), float64(budget))
			slots[g] = lt.slotsIn(&groups[g], int64(share))
			budget -= lt.poolGrains(&groups[g], slots[g])
			rest -= weights[g]
		}
		var free []int
		for _, g := range active {
			if slots[g] <= floors[g] {
				slots[g] = lt.slotsIn(&groups[g], lt.poolGrains(&groups[g], floors[g]))
				grains -= lt.poolGrains(&groups[g], slots[g])
			} else {
				free = append(free, g)
			}
		}
		if len(free) == len(active) {
			break
		}
		active = free
	}
	for g := range groups {
		if slots[g] > MaxSlots {
			return fmt.Errorf("layout: gpu pool group %d gets %d slots of %d bytes, more than the %d a pool group can index",
				groups[g].Index, slots[g], groups[g].PageBytes(), MaxSlots)
		}
	}
	return nil
}

// hotSlotsExact is HotSlots without a granule: each group gets the byte
// weights of its lifecycles, then groups below their floors are raised to
// them and the rest is shared again by weight; the slots of all groups
// together never take more than quota bytes.
func (lt *Layout) hotSlotsExact(quota int64, weights []float64, floors []int64) ([]int64, error) {
	lvl := &lt.Levels[0]
	gw := make([]float64, len(lvl.Groups))
	for lc, g := range lvl.LifeCycleToGroup {
		gw[g] += weights[lc]
	}
	gfloor := make([]int64, len(lvl.Groups))
	for g := range gfloor {
		gfloor[g] = max(floors[g], 1)
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
