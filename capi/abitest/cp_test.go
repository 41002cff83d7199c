package abitest

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

func chainKeys(tokens []int32) []uint64 {
	ts := make([]config.Token, len(tokens))
	for i, t := range tokens {
		ts[i] = config.Token(t)
	}
	var out []uint64
	for _, k := range blockhash.Chain(blockhash.Scope{}, tpb, ts) {
		out = append(out, uint64(k))
	}
	return out
}

func TestCPNullIndexAndStaleHandles(t *testing.T) {
	noLeaks(t)
	cp, err := CPCreateNull()
	require.NoError(t, err)
	s, err := CPPredict(cp, "a", seq(0, 9))
	require.NoError(t, err)
	assert.Zero(t, s)
	keys, needed, err := CPCachedBlocks(cp, "a", 4)
	require.NoError(t, err)
	assert.Empty(t, keys)
	assert.Zero(t, needed)
	require.NoError(t, CPNotifyAllocated(cp, "a", []uint64{1, 2}))
	require.NoError(t, CPNotifyFreed(cp, "a", []uint64{1, 2}))
	order, err := CPPriority(cp, []string{"c", "a", "b"})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, order, "identity order")
	order, err = CPPriority(cp, nil)
	require.NoError(t, err)
	assert.Empty(t, order)
	f, err := CPFaults(cp)
	require.NoError(t, err)
	assert.Zero(t, f)

	requireCode(t, CPPriorityNullID(cp), InvalidArgument, "request_ids[0].data", "NULL")
	requireCode(t, CPPredictNullID(cp), InvalidArgument, "request_id")
	assert.False(t, IsPoisoned())

	require.NoError(t, CPDestroy(cp))
	requireCode(t, CPDestroy(cp), InvalidHandle, "not a live handle")
	_, err = CPPredict(cp, "a", nil)
	requireCode(t, err, InvalidHandle)
	requireCode(t, CPNotifyFreed(cp, "a", nil), InvalidHandle)
	_, err = CPPredict(0, "a", nil)
	requireCode(t, err, InvalidHandle, "handle 0")

	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	_, err = CPPredict(m, "a", nil)
	requireCode(t, err, InvalidHandle, "is a manager, not a CP index")
	requireCode(t, AttachCP(m, cp), InvalidHandle)
	c2, err := CPCreateNull()
	require.NoError(t, err)
	requireCode(t, AttachCP(c2, c2), InvalidHandle, "is a CP index, not a manager")
	require.NoError(t, CPDestroy(c2))
	require.NoError(t, DestroyManager(m))
}

func TestCPDelegatingObjectIsConsumedOnEveryPath(t *testing.T) {
	noLeaks(t)
	for _, tc := range []struct {
		name      string
		ti        TestIndex
		code      int32
		destroyed int64
	}{
		{"ok", TestIndex{Slots: SlotsAll}, OK, 0},
		{"abi_version 0", TestIndex{Slots: SlotsAll, ABIVersion: -1}, InvalidArgument, 1},
		{"NULL out", TestIndex{Slots: SlotsAll, NilOut: true}, InvalidArgument, 1},
		{"struct_size too small for anything", TestIndex{Slots: SlotsAll, StructSize: 4}, InvalidArgument, 0},
		{"NULL vtable", TestIndex{NilVtable: true}, InvalidArgument, 0},
		{"NULL object", TestIndex{NilObject: true}, InvalidArgument, 0},
		{"no destroy slot", TestIndex{Slots: SlotsAll &^ SlotDestroy, ABIVersion: -1}, InvalidArgument, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := GetTestIndexStats()
			cp, err := CPCreateDelegating(tc.ti)
			d := GetTestIndexStats().Sub(before)
			assert.Equal(t, tc.destroyed, d.Destroyed, "destroy calls by the time create returns")
			if tc.code != OK {
				requireCode(t, err, tc.code)
				assert.Zero(t, cp)
				return
			}
			require.NoError(t, err)
			require.NoError(t, CPDestroy(cp))
			assert.Equal(t, int64(1), GetTestIndexStats().Sub(before).Destroyed, "destroyed exactly once")
			requireCode(t, CPDestroy(cp), InvalidHandle)
			assert.Equal(t, int64(1), GetTestIndexStats().Sub(before).Destroyed)
		})
	}
}

func TestCPDelegatingNullSlotsBehaveAsNull(t *testing.T) {
	noLeaks(t)
	before := GetTestIndexStats()
	cp, err := CPCreateDelegating(TestIndex{Slots: SlotDestroy, Score: 0.7})
	require.NoError(t, err)
	s, err := CPPredict(cp, "a", seq(0, 8))
	require.NoError(t, err)
	assert.Zero(t, s)
	keys, _, err := CPCachedBlocks(cp, "a", 8)
	require.NoError(t, err)
	assert.Empty(t, keys)
	require.NoError(t, CPNotifyAllocated(cp, "a", []uint64{1}))
	require.NoError(t, CPNotifyFreed(cp, "a", []uint64{1}))
	order, err := CPPriority(cp, []string{"x", "y", "z"})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, order)
	d := GetTestIndexStats().Sub(before)
	assert.Zero(t, d.Predicts+d.CachedCalls+d.AllocCalls+d.FreedCalls+d.PriorityCalls, "no slot was called")
	require.NoError(t, CPDestroy(cp))
	assert.Equal(t, int64(1), GetTestIndexStats().Sub(before).Destroyed)

	// A vtable whose struct_size ends after predict_prefix_reuse: the later
	// slots are set but must not be read (nor destroy called).
	before = GetTestIndexStats()
	cp, err = CPCreateDelegating(TestIndex{Slots: SlotsAll, Score: 0.25, StructSize: 16})
	require.NoError(t, err)
	s, err = CPPredict(cp, "old", seq(0, 8))
	require.NoError(t, err)
	assert.Equal(t, 0.25, s)
	order, err = CPPriority(cp, []string{"x", "y"})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, order, "get_allocation_priority lies beyond struct_size")
	require.NoError(t, CPNotifyAllocated(cp, "old", []uint64{1}))
	require.NoError(t, CPDestroy(cp))
	d = GetTestIndexStats().Sub(before)
	assert.Equal(t, int64(1), d.Predicts)
	assert.Zero(t, d.PriorityCalls+d.AllocCalls+d.Destroyed)
}

func TestCPDelegatingClampsRepairsAndContainsFailures(t *testing.T) {
	noLeaks(t)
	for _, tc := range []struct {
		score, want float64
	}{{math.NaN(), 0}, {2, 1}, {math.Inf(1), 1}, {-1, 0}, {0.4, 0.4}} {
		cp, err := CPCreateDelegating(TestIndex{Slots: SlotsAll, Score: tc.score})
		require.NoError(t, err)
		s, err := CPPredict(cp, "r", seq(0, 4))
		require.NoError(t, err)
		assert.Equal(t, tc.want, s, "score %v", tc.score)
		f, err := CPFaults(cp)
		require.NoError(t, err)
		assert.Equal(t, tc.score != tc.want, f == 1, "out-of-range scores are faults")
		require.NoError(t, CPDestroy(cp))
	}

	cp, err := CPCreateDelegating(TestIndex{Slots: SlotsAll, Mode: PriorityReverse, NumCached: 100})
	require.NoError(t, err)
	order, err := CPPriority(cp, []string{"a", "b", "c"})
	require.NoError(t, err)
	assert.Equal(t, []int{2, 1, 0}, order)
	order, err = CPPriority(cp, []string{"a", "b", "a", ""})
	require.NoError(t, err)
	assert.ElementsMatch(t, []int{0, 1, 2, 3}, order, "duplicates and empty ids keep their indices")
	keys, needed, err := CPCachedBlocks(cp, "a", 100)
	require.NoError(t, err, "the library retries the slot with a larger buffer")
	assert.Equal(t, 100, needed)
	assert.Equal(t, uint64(1000), keys[0])
	assert.Equal(t, uint64(1099), keys[99])
	_, needed, err = CPCachedBlocks(cp, "a", 0)
	require.NoError(t, err)
	assert.Equal(t, 100, needed, "a NULL buffer asks for the count")
	_, needed, err = CPCachedBlocks(cp, "a", 10)
	requireCode(t, err, BufferTooSmall)
	assert.Equal(t, 100, needed)
	require.NoError(t, CPDestroy(cp))

	cp, err = CPCreateDelegating(TestIndex{Slots: SlotsAll, Mode: PriorityGarbage})
	require.NoError(t, err)
	order, err = CPPriority(cp, []string{"a", "b", "c"})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, order, "out-of-range and repeated indices are repaired into a permutation")
	f, _ := CPFaults(cp)
	assert.Equal(t, uint64(1), f)
	require.NoError(t, CPDestroy(cp))

	cp, err = CPCreateDelegating(TestIndex{Slots: SlotsAll, Mode: CachedAlwaysShort})
	require.NoError(t, err)
	keys, _, err = CPCachedBlocks(cp, "a", 10)
	require.NoError(t, err)
	assert.Empty(t, keys, "an index that never fits its answer is a fault, answered as null")
	f, _ = CPFaults(cp)
	assert.Equal(t, uint64(1), f)
	require.NoError(t, CPDestroy(cp))

	before := GetTestIndexStats()
	cp, err = CPCreateDelegating(TestIndex{Slots: SlotsAll, Fail: true, Score: 0.9})
	require.NoError(t, err)
	s, err := CPPredict(cp, "r", seq(0, 4))
	require.NoError(t, err)
	assert.Zero(t, s)
	keys, _, err = CPCachedBlocks(cp, "r", 4)
	require.NoError(t, err)
	assert.Empty(t, keys)
	require.NoError(t, CPNotifyAllocated(cp, "r", []uint64{1}))
	require.NoError(t, CPNotifyFreed(cp, "r", []uint64{1}))
	order, err = CPPriority(cp, []string{"a", "b"})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, order)
	f, _ = CPFaults(cp)
	assert.Equal(t, uint64(5), f, "each failing slot is a fault")
	d := GetTestIndexStats().Sub(before)
	assert.Equal(t, int64(1), d.Predicts)
	assert.Equal(t, "r", d.LastID, "request ids arrive with their bytes")
	require.NoError(t, CPDestroy(cp))
}

func TestCPManagerBackedThroughTheABI(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(32, 0), nil)
	require.NoError(t, err)
	cp, err := CPCreateManagerBacked(m, []float64{1, 0.5}, 0)
	require.NoError(t, err)
	require.NoError(t, AttachCP(m, cp))
	s, err := CreateStream(m)
	require.NoError(t, err)

	sys := seq(100, 16) // 4 blocks
	c, err := CreateCacheForRequest(m, "writer", append(append([]int32{}, sys...), 7, 8), 0)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 18, 18))
	require.NoError(t, Commit(c, append(append([]int32{}, sys...), 7, 8), false))
	keys, _, err := CPCachedBlocks(cp, "writer", 16)
	require.NoError(t, err)
	assert.Equal(t, chainKeys(sys), keys, "the writer's blocks, notified at commit")
	require.NoError(t, Suspend(c))
	require.NoError(t, CloseCache(c))

	q := append(append([]int32{}, sys[:12]...), seq(900, 4)...) // 3 cached blocks of 4
	score, err := CPPredict(cp, "q", q)
	require.NoError(t, err)
	assert.InDelta(t, 12.0/16, score, 1e-12, "blocks outlive their request")
	cold, err := CPPredict(cp, "cold", seq(5000, 16))
	require.NoError(t, err)
	assert.Zero(t, cold)
	order, err := CPPriority(cp, []string{"cold", "unknown", "q"})
	require.NoError(t, err)
	assert.Equal(t, []int{2, 0, 1}, order)

	_, err = CPCreateManagerBacked(m, nil, 0)
	requireCode(t, err, InvalidState, "before the first commit")

	require.NoError(t, DestroyStream(m, s))
	require.NoError(t, DestroyManager(m))
	score, err = CPPredict(cp, "q", q)
	require.NoError(t, err)
	assert.Zero(t, score, "the manager is gone")
	require.NoError(t, CPDestroy(cp))
}

func TestAttachedCPIsNotifiedOnCreateCommitAndCloseOnly(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(32, 0), nil)
	require.NoError(t, err)
	s, err := CreateStream(m)
	require.NoError(t, err)
	base := GetTestIndexStats()
	cp, err := CPCreateDelegating(TestIndex{Slots: SlotsAll})
	require.NoError(t, err)
	require.NoError(t, AttachCP(m, cp))
	require.NoError(t, CPDestroy(cp), "the manager keeps the index alive")
	assert.Zero(t, GetTestIndexStats().Sub(base).Destroyed)

	p := seq(0, 20)
	c, err := CreateCacheForRequest(m, "req-1", p, 0)
	require.NoError(t, err)
	d := GetTestIndexStats().Sub(base)
	assert.Zero(t, d.AllocCalls, "nothing reused, nothing notified")
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 20, 20))
	require.NoError(t, Commit(c, p[:10], false))
	require.NoError(t, Commit(c, p[10:], false))
	d = GetTestIndexStats().Sub(base)
	assert.Equal(t, int64(2), d.AllocCalls)
	assert.Equal(t, int64(5), d.AllocKeys, "each full block once")
	assert.Equal(t, "req-1", d.LastID)
	info, err := GetCacheInfo(c)
	require.NoError(t, err)
	evs, _, err := DrainEvents(m, 16, 64)
	require.NoError(t, err)
	require.Len(t, evs, 5)
	for _, e := range evs {
		assert.Equal(t, info.ID, e.CacheID, "events name the committing cache")
	}
	require.NoError(t, Suspend(c))
	require.NoError(t, Resume(c, s))
	require.NoError(t, Suspend(c))
	d = GetTestIndexStats().Sub(base)
	assert.Zero(t, d.FreedCalls, "suspend and resume never free")
	assert.Equal(t, int64(2), d.AllocCalls)
	require.NoError(t, CloseCache(c))
	d = GetTestIndexStats().Sub(base)
	assert.Equal(t, int64(1), d.FreedCalls)
	assert.Equal(t, int64(5), d.FreedKeys)

	// A second request reuses 4 blocks: notified at creation. Detaching
	// later does not stop its notifications; the index lives on until it
	// is closed.
	c2, err := CreateCacheForRequest(m, "req-2", append(append([]int32{}, p[:16]...), 99), 0)
	require.NoError(t, err)
	d = GetTestIndexStats().Sub(base)
	assert.Equal(t, int64(3), d.AllocCalls)
	assert.Equal(t, int64(9), d.AllocKeys)
	require.NoError(t, DetachCP(m))
	assert.Zero(t, GetTestIndexStats().Sub(base).Destroyed, "a cache still uses the index")

	// Created after the detach: untracked.
	c3, err := CreateCacheForRequest(m, "late", p, 0)
	require.NoError(t, err)
	require.NoError(t, CloseCache(c3))
	require.NoError(t, CloseCache(c2))
	d = GetTestIndexStats().Sub(base)
	assert.Equal(t, int64(2), d.FreedCalls)
	assert.Equal(t, int64(1), d.Destroyed, "the last user let go: destroyed once")

	cp2, err := CPCreateDelegating(TestIndex{Slots: SlotsAll})
	require.NoError(t, err)
	require.NoError(t, AttachCP(m, cp2))
	c5, err := CreateCache(m, 0, "", p)
	require.NoError(t, err)
	require.NoError(t, CloseCache(c5))
	// The request id is part of ABI version 1: a struct_size that stops
	// before it is too small, not an older caller.
	_, err = CreateCacheForRequest(m, "short", p, KVCacheOptionsSizeWithoutRequestID)
	requireCode(t, err, InvalidArgument, "options.struct_size")
	d = GetTestIndexStats().Sub(base)
	assert.Equal(t, int64(2), d.FreedCalls, "caches without a request id notify nothing")
	assert.Equal(t, int64(3), d.AllocCalls)

	// Destroying the manager closes its caches (a terminal free) and lets
	// go of the index.
	c4, err := CreateCacheForRequest(m, "open", p, 0)
	require.NoError(t, err)
	_ = c4
	require.NoError(t, CPDestroy(cp2))
	require.NoError(t, DestroyStream(m, s))
	require.NoError(t, DestroyManager(m))
	d = GetTestIndexStats().Sub(base)
	assert.Equal(t, int64(3), d.FreedCalls, "the open cache's terminal free")
	assert.Equal(t, int64(2), d.Destroyed)
}

// A cache closed by kvcm_kv_cache_close while kvcm_manager_destroy runs is
// closed once: it releases its reference to the attached CP index once, so
// the index's destroy slot runs at kvcm_cp_destroy, never while its handle is
// live.
func TestManagerDestroyRacingCacheCloseReleasesTheCPIndexOnce(t *testing.T) {
	const rounds, caches = 20, 64
	for r := 0; r < rounds; r++ {
		m, err := CreateManager(smallConfig(256, 0), nil)
		require.NoError(t, err)
		cp, err := CPCreateDelegating(TestIndex{Slots: SlotsAll})
		require.NoError(t, err)
		require.NoError(t, AttachCP(m, cp))
		var cs []uint64
		for i := 0; i < caches; i++ {
			c, err := CreateCacheForRequest(m, fmt.Sprintf("req-%d", i), nil, 0)
			require.NoError(t, err)
			cs = append(cs, c)
		}
		before := GetTestIndexStats()
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_ = DestroyManager(m)
		}()
		for i := len(cs) - 1; i >= 0; i-- {
			wg.Add(1)
			go func(c uint64) {
				defer wg.Done()
				<-start
				_ = CloseCache(c) // INVALID_HANDLE when the manager got there first
			}(cs[i])
		}
		close(start)
		wg.Wait()
		destroyed := GetTestIndexStats().Sub(before).Destroyed
		require.Zero(t, destroyed, "round %d: the CP index's destroy slot ran while its handle %#x is live", r, cp)
		require.NoError(t, CPDestroy(cp))
		require.Equal(t, int64(1), GetTestIndexStats().Sub(before).Destroyed)
	}
}

// kvcm_manager_attach_cp racing kvcm_cp_destroy never attaches a destroyed
// index: either the attach fails or the index lives on until it is
// detached, so later caches never notify a destroyed C object.
func TestAttachCPRacingCPDestroyNeverAttachesADestroyedIndex(t *testing.T) {
	m, err := CreateManager(smallConfig(64, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	// Keep the manager's lock busy so that attach waits on it after its lookup.
	stop := make(chan struct{})
	var busy sync.WaitGroup
	for i := 0; i < 2; i++ {
		busy.Add(1)
		go func() {
			defer busy.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if p, err := Alloc(m, MemoryHostMapped, 8<<20); err == nil {
					_ = Free(m, p)
				}
			}
		}()
	}
	defer func() { close(stop); busy.Wait() }()
	for r := 0; r < 2000; r++ {
		cp, err := CPCreateDelegating(TestIndex{Slots: SlotsAll})
		require.NoError(t, err)
		before := GetTestIndexStats()
		var attachErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); attachErr = AttachCP(m, cp) }()
		go func() {
			defer wg.Done()
			for i := 0; i < r%50; i++ {
				runtime.Gosched()
			}
			_ = CPDestroy(cp)
		}()
		wg.Wait()
		if attachErr == nil && GetTestIndexStats().Sub(before).Destroyed != 0 {
			c, err := CreateCacheForRequest(m, "after-destroy", seq(0, 8), 0)
			require.NoError(t, err)
			require.NoError(t, CloseCache(c))
			d := GetTestIndexStats().Sub(before)
			t.Fatalf("round %d: attach succeeded with an index whose destroy slot already ran; later slot calls on the destroyed object: alloc %d, freed %d", r, d.AllocCalls, d.FreedCalls)
		}
		require.NoError(t, DetachCP(m))
	}
}
