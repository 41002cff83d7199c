package core

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The free-slot set hands out its lowest slot, also across the words of its
// summary and after slots come back out of order, and dropFrom removes
// exactly the slots from its bound on.
func TestFreeSlotsHandOutTheLowestFirst(t *testing.T) {
	var f freeSlots
	const n = 3*4096 + 70
	f.reset(n)
	for _, s := range []int32{n - 1, 4096 * 2, 65, 64, 4095, 0} {
		f.put(s)
	}
	require.Equal(t, 6, f.len())
	var got []int32
	for f.len() > 0 {
		got = append(got, f.take())
	}
	assert.Equal(t, []int32{0, 64, 65, 4095, 4096 * 2, n - 1}, got)

	for _, s := range []int32{9000, 3, 8192, 100} {
		f.put(s)
	}
	f.dropFrom(8192)
	var left []int32
	f.each(func(s int32) { left = append(left, s) })
	assert.Equal(t, []int32{3, 100}, left)
	assert.Equal(t, int32(3), f.take())
	f.put(2)
	assert.Equal(t, int32(2), f.take(), "a slot that came back is the lowest again")
	assert.Equal(t, int32(100), f.take())
	assert.Zero(t, f.len())
}

// The victim set gives its pages lowest priority first, then least recently
// released (then deepest), whether they came in that order (the run) or not
// (the heap), also after pages leave it from anywhere and change their order;
// each page knows where it is.
func TestVictimSetPopsInEvictionOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var vs victimSet
	vs.reserve(64) // smaller than what it holds: the run compacts and grows
	tick := uint64(0)
	newPage := func() *page {
		p := &page{heapIdx: -1, prioSet: true, prio: int8(rng.IntN(3))}
		if rng.IntN(4) > 0 {
			tick++ // mostly in order, as releases come
			p.lastUsed = tick
		} else {
			p.lastUsed = uint64(rng.IntN(int(tick) + 1))
		}
		return p
	}
	var in []*page
	for range 300 {
		p := newPage()
		vs.push(p)
		in = append(in, p)
		if rng.IntN(3) == 0 {
			k := rng.IntN(len(in))
			q := in[k]
			require.Same(t, q, vs.remove(q))
			assert.False(t, q.inVictims())
			if rng.IntN(2) == 0 {
				q.prio, q.lastUsed = int8(rng.IntN(3)), tick
				vs.push(q) // back, in a new order
			} else {
				in = slices.Delete(in, k, k+1)
			}
		}
	}
	require.Equal(t, len(in), vs.len())
	vs.each(func(v victim, inHeap bool, i int) {
		if inHeap {
			require.Equal(t, i, v.p.heapIdx, "a page knows its index")
		} else {
			require.Equal(t, -2-i, v.p.heapIdx, "a page knows its index")
		}
	})
	var got []victim
	for vs.len() > 0 {
		p := vs.pop()
		require.False(t, p.inVictims())
		got = append(got, p.victimKey())
	}
	assert.Len(t, got, len(in))
	assert.True(t, slices.IsSortedFunc(got, func(a, b victim) int {
		switch {
		case a.before(&b):
			return -1
		case b.before(&a):
			return 1
		}
		return 0
	}))
}

// A run full of pages compacts only when at least half of it is holes, and
// grows otherwise, so that compacting costs at most one move per push.
func TestVictimRunCompactsOnlyWhenHalfIsHoles(t *testing.T) {
	var vs victimSet
	vs.reserve(8)
	tick := uint64(0)
	push := func() *page {
		tick++
		p := &page{heapIdx: -1, prioSet: true, lastUsed: tick}
		vs.push(p)
		return p
	}
	var old []*page
	for range 8 {
		old = append(old, push())
	}
	vs.remove(old[3])
	young := []*page{push()}
	require.Len(t, vs.run, 9, "one hole in eight: the run grew")
	for len(vs.run) < cap(vs.run) {
		young = append(young, push())
	}
	for _, p := range old {
		if p.inVictims() {
			vs.remove(p)
		}
	}
	require.LessOrEqual(t, 2*vs.queued, len(vs.run), "half the full run is holes")
	queued := vs.queued
	push()
	assert.Len(t, vs.run, queued+1, "compacted: only the pages are left")
	for _, p := range young[:3] {
		assert.Same(t, p, vs.pop(), "the order survives the compaction")
	}
}
