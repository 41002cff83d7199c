package cp

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

func TestDelegatingWithNoMethodsBehavesAsNull(t *testing.T) {
	d := NewDelegating(External{}, DelegatingOptions{})
	assert.Equal(t, Capabilities{}, d.Capabilities())
	var n Null
	ids := []string{"b", "a", "c"}
	assert.Equal(t, n.PredictPrefixReuse("a", seq(0, 8)), d.PredictPrefixReuse("a", seq(0, 8)))
	assert.Equal(t, n.GetCPCachedBlocks("a"), d.GetCPCachedBlocks("a"))
	assert.Equal(t, n.GetAllocationPriority(ids), d.GetAllocationPriority(ids))
	d.NotifyBlocksAllocated("a", []blockhash.Key{1})
	d.NotifyBlocksFreed("a", []blockhash.Key{1})
	assert.Zero(t, d.Faults())
}

func TestDelegatingForwardsPresentMethods(t *testing.T) {
	var allocated, freed []blockhash.Key
	d := NewDelegating(External{
		PredictPrefixReuse: func(id string, tokens []config.Token) (float64, error) { return 0.25, nil },
		GetCPCachedBlocks:  func(string) ([]blockhash.Key, error) { return []blockhash.Key{7, 8}, nil },
		NotifyBlocksAllocated: func(_ string, k []blockhash.Key) error {
			allocated = append(allocated, k...)
			return nil
		},
		NotifyBlocksFreed: func(_ string, k []blockhash.Key) error {
			freed = append(freed, k...)
			return nil
		},
		GetAllocationPriority: func(ids []string) ([]string, error) { return []string{ids[2], ids[0], ids[1]}, nil },
	}, DelegatingOptions{})
	c := d.Capabilities()
	assert.True(t, c.PredictPrefixReuse && c.GetCPCachedBlocks && c.NotifyBlocksAllocated && c.NotifyBlocksFreed && c.GetAllocationPriority)
	assert.False(t, c.Generation)
	assert.Equal(t, 0.25, d.PredictPrefixReuse("a", nil))
	assert.Equal(t, []blockhash.Key{7, 8}, d.GetCPCachedBlocks("a"))
	g := d.Generation()
	d.NotifyBlocksAllocated("a", []blockhash.Key{1, 2})
	assert.NotEqual(t, g, d.Generation(), "without an external generation, notifications advance it")
	d.NotifyBlocksFreed("a", []blockhash.Key{1, 2})
	assert.Equal(t, []blockhash.Key{1, 2}, allocated)
	assert.Equal(t, []blockhash.Key{1, 2}, freed)
	assert.Equal(t, []string{"z", "x", "y"}, d.GetAllocationPriority([]string{"x", "y", "z"}))
	assert.Zero(t, d.Faults())
}

func TestDelegatingClampsScores(t *testing.T) {
	var next float64
	var faults []string
	d := NewDelegating(External{
		PredictPrefixReuse: func(string, []config.Token) (float64, error) { return next, nil },
	}, DelegatingOptions{OnFault: func(m, p string) { faults = append(faults, m+": "+p) }})
	for _, c := range []struct{ raw, want float64 }{
		{math.NaN(), 0}, {-3, 0}, {0.5, 0.5}, {7, 1}, {math.Inf(1), 1}, {math.Inf(-1), 0},
	} {
		next = c.raw
		assert.Equal(t, c.want, d.PredictPrefixReuse("r", nil), "raw %v", c.raw)
	}
	assert.Equal(t, uint64(5), d.Faults(), "every out-of-range score is a fault")
	assert.Len(t, faults, 5)
}

func TestDelegatingContainsPanicsAndErrors(t *testing.T) {
	boom := errors.New("index down")
	d := NewDelegating(External{
		PredictPrefixReuse:    func(string, []config.Token) (float64, error) { panic("segfault in the index") },
		GetCPCachedBlocks:     func(string) ([]blockhash.Key, error) { return []blockhash.Key{1}, boom },
		NotifyBlocksAllocated: func(string, []blockhash.Key) error { panic(boom) },
		NotifyBlocksFreed:     func(string, []blockhash.Key) error { return boom },
		GetAllocationPriority: func([]string) ([]string, error) { panic("nil map") },
		Generation:            func() (uint64, error) { return 0, boom },
	}, DelegatingOptions{OnFault: func(string, string) { panic("even the fault hook panics") }})
	ids := []string{"a", "b"}
	require.NotPanics(t, func() {
		assert.Zero(t, d.PredictPrefixReuse("a", seq(0, 4)))
		assert.Nil(t, d.GetCPCachedBlocks("a"))
		d.NotifyBlocksAllocated("a", nil)
		d.NotifyBlocksFreed("a", nil)
		assert.Equal(t, ids, d.GetAllocationPriority(ids), "failure falls back to input order")
		d.Generation()
	})
	assert.Equal(t, uint64(6), d.Faults())
}

func TestDelegatingRepairsGarbageOrders(t *testing.T) {
	var answer []string
	d := NewDelegating(External{
		GetAllocationPriority: func([]string) ([]string, error) { return answer, nil },
	}, DelegatingOptions{})
	ids := []string{"a", "b", "c", "d"}
	for _, garbage := range [][]string{
		nil, {}, {"d"}, {"x", "y"}, {"a", "a", "a", "a"}, {"d", "c", "b", "a", "e", "f"},
	} {
		answer = garbage
		got := d.GetAllocationPriority(ids)
		assert.ElementsMatch(t, ids, got, "answer %q", garbage)
	}
	answer = []string{"c", "zz", "a"}
	assert.Equal(t, []string{"c", "a", "b", "d"}, d.GetAllocationPriority(ids),
		"the external order is kept where valid, the rest follows in input order")
}

func TestDelegatingCanOrderByScoresWhenPriorityIsMissing(t *testing.T) {
	scores := map[string]float64{"a": 0.1, "b": 0.9, "c": 0.5}
	d := NewDelegating(External{
		PredictPrefixReuse: func(id string, _ []config.Token) (float64, error) { return scores[id], nil },
	}, DelegatingOptions{OrderByScores: true})
	for _, id := range []string{"a", "b", "c"} {
		d.PredictPrefixReuse(id, nil)
	}
	assert.Equal(t, []string{"b", "c", "a", "new"}, d.GetAllocationPriority([]string{"a", "b", "c", "new"}))
	d.NotifyBlocksFreed("b", nil)
	assert.Equal(t, []string{"c", "a", "b"}, d.GetAllocationPriority([]string{"a", "b", "c"}),
		"a freed request's score is forgotten")
}

func TestDelegatingGenerationFollowsTheExternalOne(t *testing.T) {
	var g uint64 = 5
	d := NewDelegating(External{Generation: func() (uint64, error) { return g, nil }}, DelegatingOptions{})
	a := d.Generation()
	assert.Equal(t, a, d.Generation(), "stable while nothing changes")
	g++
	assert.NotEqual(t, a, d.Generation())
}

// The external index gets a copy of the tokens: whatever it does to them,
// the caller's prompt is unchanged.
func TestDelegatingShieldsTheCallersTokens(t *testing.T) {
	d := NewDelegating(External{
		PredictPrefixReuse: func(_ string, tokens []config.Token) (float64, error) {
			for i := range tokens {
				tokens[i] = -1
			}
			return 0.5, nil
		},
	}, DelegatingOptions{})
	prompt := seq(1, 8)
	d.PredictPrefixReuse("r", prompt)
	assert.Equal(t, seq(1, 8), prompt, "the caller's prompt must not be modified through the adapter")
}

// The generation changes whenever the external generation or the
// notification count changes, also when both change at once.
func TestDelegatingGenerationChangesWhenEitherInputChanges(t *testing.T) {
	const c = uint64(0x9E3779B97F4A7C15)
	inv := c // Newton iteration for the inverse of an odd number mod 2^64
	for i := 0; i < 6; i++ {
		inv *= 2 - c*inv
	}
	require.Equal(t, uint64(1), c*inv)
	ext := uint64(0)
	d := NewDelegating(External{Generation: func() (uint64, error) { return ext, nil }}, DelegatingOptions{})
	g0 := d.Generation()
	d.NotifyBlocksAllocated("r", []blockhash.Key{1}) // own counter 0 -> 1
	ext = inv                                        // the external index's scores changed too
	assert.NotEqual(t, g0, d.Generation(), "both the external generation and the notification count changed")
}
