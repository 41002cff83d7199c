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

// The victim heap gives its pages lowest priority first, then least recently
// released, then deepest, also after pages leave it from anywhere and change
// their order in place; each page knows its index in it.
func TestVictimHeapPopsInEvictionOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var h victimHeap
	add := func(v victim) {
		v.p = &page{}
		h = append(h, victim{})
		h.up(len(h)-1, v)
	}
	random := func() victim {
		return victim{prio: rng.IntN(4), depth: rng.IntN(8), lastUsed: uint64(rng.IntN(16))}
	}
	for range 500 {
		add(random())
	}
	for range 100 {
		p := h[rng.IntN(len(h))].p
		require.Same(t, p, h.remove(p.heapIdx))
		assert.Equal(t, -1, p.heapIdx)
		i := rng.IntN(len(h))
		v := random()
		v.p = h[i].p
		h[i] = v
		h.fix(i)
	}
	for i, v := range h {
		require.Equal(t, i, v.p.heapIdx, "a page knows its index")
	}
	var got []victim
	for len(h) > 0 {
		v := h[0]
		require.Same(t, v.p, h.pop())
		got = append(got, v)
	}
	assert.Len(t, got, 400)
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
