package core

import (
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
