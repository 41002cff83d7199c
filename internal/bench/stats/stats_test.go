package stats

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// An odd count's median is its middle value, whatever the order it came in.
func TestMedianOfAnOddCountIsTheMiddleValue(t *testing.T) {
	assert.Equal(t, 3.0, Median([]float64{5, 1, 3}))
	assert.Equal(t, 7.0, Median([]float64{7}))
	assert.Equal(t, 20*time.Millisecond, Median([]time.Duration{30 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond}))
}

// An even count's median is the mean of the two middle values; a Duration's
// mean is truncated toward zero.
func TestMedianOfAnEvenCountIsTheMeanOfTheMiddleTwo(t *testing.T) {
	assert.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}))
	assert.Equal(t, time.Duration(2), Median([]time.Duration{5, 1, 2, 3}))
	assert.Equal(t, time.Duration(-2), Median([]time.Duration{-1, -4}))
}

// The benches keep the runs they summarize: Median and MedianRatio sort a
// copy, never the caller's slice.
func TestMedianLeavesItsInputUnchanged(t *testing.T) {
	v := []float64{3, 1, 2, 0}
	w := []float64{6, 2, 8, 1}
	Median(v)
	MedianRatio(v, w)
	assert.Equal(t, []float64{3, 1, 2, 0}, v)
	assert.Equal(t, []float64{6, 2, 8, 1}, w)
}

// No runs have a median of zero.
func TestMedianOfNothingIsZero(t *testing.T) {
	assert.Zero(t, Median[float64](nil))
	assert.Zero(t, Median([]time.Duration{}))
	assert.Zero(t, MedianRatio(nil, []float64{1}))
}

// A ratio pairs each run with the reference run of its own round: a
// reference that drifts between rounds cancels out, where the ratio of the
// medians would not. Pairs beyond the shorter slice are ignored.
func TestMedianRatioPairsRunsOfTheSameRound(t *testing.T) {
	limit := []float64{100, 60, 80}
	codec := []float64{90, 54, 60}
	assert.InDelta(t, 0.9, MedianRatio(codec, limit), 1e-9)
	assert.InDelta(t, 0.75, Median(codec)/Median(limit), 1e-9, "the ratio of the medians mixes rounds")
	assert.InDelta(t, 0.9, MedianRatio(codec, append(slices.Clone(limit), 1, 1, 1, 1)), 1e-9)
}

type round struct {
	cpu   float64
	label string
}

// MedianBy picks a whole element, the middle one by key, the upper of the
// middle two for an even count, and leaves its input's order alone.
func TestMedianByPicksTheMiddleElementByKey(t *testing.T) {
	key := func(r round) float64 { return r.cpu }
	odd := []round{{3, "c"}, {1, "a"}, {2, "b"}}
	assert.Equal(t, round{2, "b"}, MedianBy(odd, key))
	assert.Equal(t, []round{{3, "c"}, {1, "a"}, {2, "b"}}, odd)
	even := []round{{4, "d"}, {1, "a"}, {3, "c"}, {2, "b"}}
	assert.Equal(t, round{3, "c"}, MedianBy(even, key))
	assert.Equal(t, round{}, MedianBy(nil, key))
}
