package layout_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// groups: a full-attention layer with key and value buffers of bufBytes and,
// when windowed, a sliding-window layer with one buffer of bufBytes/2, so the
// hot level has one or two pool groups.
func groups(bufBytes int64, windowed bool) (*config.Config, *layout.Layout) {
	cfg := &config.Config{
		TokensPerBlock: 4,
		CacheTiers:     []config.CacheTierConfig{config.GPU(1), config.Host(1)},
		Layers: []config.AttentionLayerConfig{
			{LayerID: 0, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: bufBytes}, {Role: config.RoleValue, Size: bufBytes}}},
		},
	}
	cold := []int64{2 * bufBytes}
	if windowed {
		cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{
			LayerID: 1, SlidingWindowSize: 64, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: bufBytes / 2}},
		})
		cold = append(cold, bufBytes/2)
	}
	lt := layout.New(cfg)
	if err := lt.SetColdPageBytes(cold); err != nil {
		panic(err)
	}
	return cfg, lt
}

// fitsQuota checks the sizing contract: no group has more than MaxSlots
// slots, and all slots together take at most quota bytes, with no product
// overflowing.
func fitsQuota(t *testing.T, quota int64, groups []layout.Group, slots []int64) {
	t.Helper()
	require.Len(t, slots, len(groups))
	var total int64
	for g, n := range slots {
		assert.Positive(t, n)
		assert.LessOrEqual(t, n, int64(layout.MaxSlots))
		b, ok := layout.CheckedMul(n, groups[g].PageBytes())
		require.True(t, ok, "group %d: %d slots of %d bytes overflow", g, n, groups[g].PageBytes())
		require.LessOrEqual(t, b, math.MaxInt64-total, "the groups' bytes overflow")
		total += b
	}
	assert.LessOrEqual(t, total, quota, "slots %v take more than the quota", slots)
}

// Sizing never hands out more bytes than the quota, even at the top of the
// int64 range, where float rounding used to round slots up past the quota and
// the slots' bytes overflowed.
func TestSlotsNeverExceedTheQuota(t *testing.T) {
	for _, buf := range []int64{1 << 40, 3 << 39, 1<<41 + 12345} {
		for _, windowed := range []bool{false, true} {
			cfg, lt := groups(buf, windowed)
			fitsEveryQuota(t, cfg, lt)
			cfg.CacheTiers[0].PoolGranularity = config.KVCM2PoolGranularity
			lt.HotGranularity = layout.New(cfg).HotGranularity
			fitsEveryQuota(t, cfg, lt)
		}
	}
}

// fitsEveryQuota checks the sizing contract for quotas up to MaxInt64.
func fitsEveryQuota(t *testing.T, cfg *config.Config, lt *layout.Layout) {
	t.Helper()
	w := lt.ByteWeights(cfg)
	for _, quota := range []int64{math.MaxInt64, math.MaxInt64 - 1, 1 << 62, 3<<61 + 7} {
		slots, err := lt.HotSlots(quota, w, lt.HotFloors(cfg))
		require.NoError(t, err, "quota %d", quota)
		// The hot pools take the quota rounded to their granules.
		fitsQuota(t, lt.HotQuota(quota, lt.HotFloors(cfg)), lt.Levels[0].Groups, slots)
		slots, err = lt.ColdSlots(1, quota, w)
		require.NoError(t, err, "quota %d", quota)
		fitsQuota(t, quota, lt.Levels[1].Groups, slots)
	}
}

// A quota that would give a pool group more slots than an int32 indexes is an
// error, not a wrapped count.
func TestSlotsBeyondMaxSlotsAreAnError(t *testing.T) {
	cfg, lt := groups(64, true)
	w := lt.ByteWeights(cfg)
	_, err := lt.HotSlots(math.MaxInt64, w, lt.HotFloors(cfg))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "more than the 2147483647 a pool group can index")
	_, err = lt.ColdSlots(1, math.MaxInt64, w)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "more than the 2147483647 a pool group can index")
}

// TestBatchPagesCountTheSystemPromptOnce: the full blocks of a batch's system
// prompt are held once for the batch, as far as the shortest request reaches
// and as far as some request's window still needs them; a partial block is
// each request's own.
func TestBatchPagesCountTheSystemPromptOnce(t *testing.T) {
	_, lt := groups(64, true) // tpb 4; life cycle 0 full attention, 1 a 64-token window
	req := func(capacity, history int) config.RequestDesc {
		return config.RequestDesc{Capacity: capacity, HistoryLength: history}
	}
	three := []config.RequestDesc{req(40, 0), req(40, 0), req(40, 0)} // 10 blocks each
	assert.Equal(t, int64(30), lt.BatchPages(0, config.BatchDesc{Requests: three}, nil))
	// 18 tokens: 4 full shared blocks, held once; the rest 6 blocks a request.
	assert.Equal(t, int64(4+3*6), lt.BatchPages(0, config.BatchDesc{Requests: three, SystemPromptLength: 18}, nil))
	// The shortest request (12 tokens, 3 blocks) bounds the shared blocks.
	short := []config.RequestDesc{req(40, 0), req(12, 0)}
	assert.Equal(t, int64(3+7+0), lt.BatchPages(0, config.BatchDesc{Requests: short, SystemPromptLength: 40}, nil))
	// A windowed layer of requests that computed 100 tokens keeps blocks from
	// (100-64)/4 = 9 on: shared blocks before it are needed by none.
	long := []config.RequestDesc{req(120, 100), req(120, 100)} // 30 blocks, 21 kept each
	assert.Equal(t, int64(42), lt.BatchPages(1, config.BatchDesc{Requests: long}, nil))
	// 48 shared tokens = 12 blocks; blocks 9..11 are kept, once: 3 + 2*(21-3).
	assert.Equal(t, int64(3+2*18), lt.BatchPages(1, config.BatchDesc{Requests: long, SystemPromptLength: 48}, nil))
}

// TestSystemPromptLowersConstraintFloors: a constraint batch sharing a system
// prompt needs fewer hot slots than the same batch without one (each floor
// leaves room for the resume gate: pages / max_util_for_resume, rounded up).
func TestSystemPromptLowersConstraintFloors(t *testing.T) {
	cfg, lt := groups(64, false)
	cfg.MaxUtilForResume = 0.5
	batch := config.BatchDesc{Requests: []config.RequestDesc{{Capacity: 40}, {Capacity: 40}}}
	cfg.Constraints = []config.BatchDesc{batch}
	assert.Equal(t, []int64{2 * 20}, lt.HotFloors(cfg))
	batch.SystemPromptLength = 32
	cfg.Constraints = []config.BatchDesc{batch}
	assert.Equal(t, []int64{2 * (8 + 2*2)}, lt.HotFloors(cfg))
}

// TestConstraintFloorsLeaveResumeHeadroom: a constraint batch's pages in a
// pool group of growing layer groups are divided by max_util_for_resume,
// rounded up, so the whole batch resumes under the gate; the SSM layer
// group's pool group (one state a request, no growth) gets the pages alone.
// Structural floors sum per pool group. As KVCacheManagerV2 sizes them.
func TestConstraintFloorsLeaveResumeHeadroom(t *testing.T) {
	cfg := &config.Config{
		TokensPerBlock:   4,
		MaxUtilForResume: 0.95,
		CacheTiers:       []config.CacheTierConfig{config.GPU(1)},
		Layers: []config.AttentionLayerConfig{
			{LayerID: 0, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 64}}},
			{LayerID: 1, SlidingWindowSize: 8, NumSinkTokens: 4, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 32}}},
		},
		SsmLayers: []config.SsmLayerConfig{{LayerID: 2, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 48}}}},
	}
	lt := layout.New(cfg)
	require.Len(t, lt.Levels[0].Groups, 3)
	// Window 8 of 4-token blocks with one sink block: 1 + (8+2)/4 + 1 = 4;
	// full attention takes the largest window floor; the SSM state 1.
	assert.Equal(t, []int64{4, 4, 1}, []int64{lt.StructuralFloor(0), lt.StructuralFloor(1), lt.StructuralFloor(2)})
	assert.Equal(t, []int64{4, 4, 1}, lt.HotFloors(cfg))
	reqs := make([]config.RequestDesc, 32)
	for i := range reqs {
		reqs[i] = config.RequestDesc{Capacity: 1}
	}
	cfg.Constraints = []config.BatchDesc{{Requests: reqs}}
	// 32 one-block requests: 32 pages in each attention group, 34 slots
	// (32 / 0.95 = 33.7) so that resuming the last one stays under 0.95; 32
	// SSM states.
	assert.Equal(t, []int64{34, 34, 32}, lt.HotFloors(cfg))
	assert.Equal(t, []int64{34, 34, 32}, lt.ConstraintSlots(cfg))
	assert.Equal(t, int64(34*64+34*32+32*48), lt.FloorBytes(lt.HotFloors(cfg)))
	// With KVCacheManagerV2's granule each of the three pools takes one.
	cfg.CacheTiers[0].PoolGranularity = config.KVCM2PoolGranularity
	assert.Equal(t, int64(3*(2<<20)), layout.New(cfg).FloorBytes(lt.HotFloors(cfg)))
}

// TestSharedPoolGroupFloorsSum: layer groups sharing one hot pool group get
// the sum of their structural floors (two windows' worth here), as
// KVCacheManagerV2 reserves worst-case slots per layer group.
func TestSharedPoolGroupFloorsSum(t *testing.T) {
	cfg := &config.Config{
		TokensPerBlock: 32,
		CacheTiers:     []config.CacheTierConfig{config.GPU(1)},
		Layers: []config.AttentionLayerConfig{
			{LayerID: 0, SlidingWindowSize: 32, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 2 << 20}}},
			{LayerID: 1, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 2 << 20}}},
		},
	}
	lt := layout.New(cfg)
	require.Len(t, lt.Levels[0].Groups, 1)
	assert.Equal(t, []int64{2 + 2}, lt.HotFloors(cfg))
}

// TestBatchPagesCountScratchSlotsWithScratchReuse: with SWA scratch reuse a
// request's scratch blocks (the step's new blocks out of the window) count as
// the scratch slots they share, one layer at a time, not a page each.
func TestBatchPagesCountScratchSlotsWithScratchReuse(t *testing.T) {
	cfg := &config.Config{TokensPerBlock: 4, CacheTiers: []config.CacheTierConfig{config.GPU(1)}}
	for id := range int32(4) { // one window layer group: a slot holds 4 scratch blocks
		cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{
			LayerID: id, SlidingWindowSize: 64, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 64}},
		})
	}
	lt := layout.New(cfg)
	prefill := config.BatchDesc{Requests: []config.RequestDesc{{Capacity: 400}, {Capacity: 400}}} // 100 blocks each
	assert.Equal(t, int64(2*100), lt.BatchPages(0, prefill, nil))
	lo, hi := lt.ScratchRange(0, 0, 400, 0)
	require.Equal(t, []int{0, 84}, []int{lo, hi}, "the blocks before the last window are scratch")
	scratch := &config.SwaScratchReuseConfig{}
	assert.Equal(t, int64(2*(100-84+84/4)), lt.BatchPages(0, prefill, scratch))
}

// TestGpuPoolGranularity: the hot pools' granule is KVCacheManagerV2's, 2 MiB
// below 2 GiB of quota, doubling with every doubling of the quota, at most 32
// MiB.
func TestGpuPoolGranularity(t *testing.T) {
	const mib, gib = int64(1 << 20), int64(1 << 30)
	for quota, want := range map[int64]int64{
		1: 2 * mib, gib: 2 * mib, 2*gib - 1: 2 * mib, 2 * gib: 4 * mib, 5 * gib: 8 * mib,
		8 * gib: 16 * mib, 16 * gib: 32 * mib, 1 << 50: 32 * mib,
	} {
		assert.Equal(t, want, layout.GpuPoolGranularity(quota), "quota %d", quota)
	}
}

// TestHotPoolsAreWholeGranules: every hot pool is a whole number of granules
// and a group gets every slot its granules hold, so a group of small slots
// gets a granule's worth however small its share; a quota is rounded up to
// the granule and raised to the floors' granules (KVCacheManagerV2's
// rounding).
func TestHotPoolsAreWholeGranules(t *testing.T) {
	const gran = int64(2 << 20)
	window := func(size int64, quota int64) *config.Config {
		return &config.Config{
			TokensPerBlock: 4,
			CacheTiers:     []config.CacheTierConfig{{Kind: config.GPUTier, Quota: quota, PoolGranularity: config.KVCM2PoolGranularity}},
			Layers: []config.AttentionLayerConfig{
				{LayerID: 0, SlidingWindowSize: 4, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: size}}},
				{LayerID: 1, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: gran}}},
			},
			Constraints: []config.BatchDesc{{Requests: []config.RequestDesc{{Capacity: 4}}}},
		}
	}
	// Five granules, floors of 2 slots each: two granules hold two slots of
	// a granule less a byte, three hold three slots of a granule.
	cfg := window(gran-1, 5*gran)
	lt := layout.New(cfg)
	floors := lt.HotFloors(cfg)
	require.Equal(t, []int64{2, 2}, floors)
	slots, err := lt.HotSlots(5*gran, lt.ByteWeights(cfg), floors)
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 3}, slots)
	// Slots of 1 KiB get a whole granule: 2048 slots. A quota of 2 granules is
	// raised to the 3 the floors take (2 slots of a granule and a byte: 2).
	cfg = window(1024, 2*gran)
	cfg.Layers[1].Buffers[0].Size = gran/2 + 1
	cfg.TypicalStep = &config.BatchDesc{Requests: []config.RequestDesc{{Capacity: 4}}}
	lt = layout.New(cfg)
	floors = lt.HotFloors(cfg)
	assert.Equal(t, 3*gran, lt.HotQuota(2*gran, floors))
	assert.Equal(t, 3*gran, lt.HotQuota(3*gran-1, floors))
	slots, err = lt.HotSlots(lt.HotQuota(2*gran, floors), lt.ByteWeights(cfg), floors)
	require.NoError(t, err)
	assert.Equal(t, []int64{2048, 3}, slots)
	_, err = lt.HotSlots(3*gran-1-2*gran, lt.ByteWeights(cfg), floors)
	assert.ErrorContains(t, err, "below the 6291456 bytes its minimum slots need")
	// Without a granule the pools are sized to the byte.
	cfg.CacheTiers[0].PoolGranularity = 0
	lt = layout.New(cfg)
	assert.Equal(t, int64(2*1024+2*(gran/2+1)), lt.HotQuota(2*gran/3, floors))
}

// TestTypicalStepWeightsAreWholeGranules: with a granule, a typical step's
// weights are the bytes of each pool group's pages with every pool rounded up
// to whole granules, as KVCacheManagerV2's ratio_from_batch converts a
// batch's slots to bytes: 4 slots of 1 KiB weigh a granule, not 4 KiB.
func TestTypicalStepWeightsAreWholeGranules(t *testing.T) {
	const gran = int64(2 << 20)
	cfg := &config.Config{
		TokensPerBlock: 4,
		CacheTiers:     []config.CacheTierConfig{{Kind: config.GPUTier, Quota: 10 * gran, PoolGranularity: config.KVCM2PoolGranularity}},
		Layers: []config.AttentionLayerConfig{
			{LayerID: 0, SlidingWindowSize: 4, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 1024}}},
			{LayerID: 1, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: gran}}},
		},
		TypicalStep: &config.BatchDesc{Requests: []config.RequestDesc{{Capacity: 16}}},
	}
	lt := layout.New(cfg)
	w := lt.ByteWeights(cfg)
	assert.InDeltaSlice(t, []float64{0.2, 0.8}, w, 1e-12)
	floors := lt.HotFloors(cfg)
	slots, err := lt.HotSlots(10*gran, w, floors)
	require.NoError(t, err)
	// The window's group shares 2 of the 10 granules (2048 slots each); the
	// full-attention group the other 8.
	assert.Equal(t, []int64{4096, 8}, slots)
	// Without a granule the weights are the pages' bytes.
	cfg.CacheTiers[0].PoolGranularity = 0
	lt = layout.New(cfg)
	assert.InDeltaSlice(t, []float64{4096.0 / (4096 + 4*float64(gran)), 4 * float64(gran) / (4096 + 4*float64(gran))}, lt.ByteWeights(cfg), 1e-12)
}
