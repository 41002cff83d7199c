package capi

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handle resolves to its value until it is freed, then never again: its
// slot, reused, holds a handle with another sequence number.
func TestHandleNeverReused(t *testing.T) {
	before := liveHandles()
	a := newHandle("a")
	v, ok := handleValue(a)
	require.True(t, ok)
	assert.Equal(t, "a", v)
	require.True(t, deleteHandle(a))
	assert.False(t, deleteHandle(a), "a freed handle is freed once")
	b := newHandle("b")
	defer deleteHandle(b)
	assert.NotEqual(t, a, b)
	assert.Equal(t, a&slotMask, b&slotMask, "the freed slot is reused")
	_, ok = handleValue(a)
	assert.False(t, ok, "the freed handle does not resolve to the slot's new value")
	_, ok = handleValue(0)
	assert.False(t, ok, "0 is never valid")
	_, ok = handleValue(b + 1)
	assert.False(t, ok, "a forged value is not a handle")
	assert.Equal(t, before+1, liveHandles())
}

// Of concurrent deleters of one handle exactly one wins, and lookups during
// issuing and freeing see either the value or no handle.
func TestHandleConcurrentDelete(t *testing.T) {
	for range 100 {
		h := newHandle(concurrentValue)
		var wg sync.WaitGroup
		wins := make(chan bool, 4)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if v, ok := handleValue(h); ok {
					assert.Equal(t, concurrentValue, v)
				}
				wins <- deleteHandle(h)
			}()
		}
		wg.Wait()
		close(wins)
		n := 0
		for w := range wins {
			if w {
				n++
			}
		}
		assert.Equal(t, 1, n)
	}
}

// concurrentValue is the value TestHandleConcurrentDelete registers.
const concurrentValue = "value"

// BenchmarkHandleLookup is the cost every C call pays to resolve its handle.
func BenchmarkHandleLookup(b *testing.B) {
	hs := make([]uint64, 64)
	for i := range hs {
		hs[i] = newHandle(&kvCacheObj{})
	}
	defer func() {
		for _, h := range hs {
			deleteHandle(h)
		}
	}()
	b.ResetTimer()
	for i := range b.N {
		if _, st := lookup[*kvCacheObj]("f", "cache", hs[i&63], "KV cache"); st != nil {
			b.Fatal("lookup failed")
		}
	}
}
