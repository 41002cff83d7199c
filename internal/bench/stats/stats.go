// Package stats holds the summaries the kvcm benchmarks report: one
// definition of the median for every bench, so that their tables agree on
// what "median of N runs" means.
package stats

import (
	"cmp"
	"slices"
)

// Median returns the median of v: the middle value of v in order, or the
// mean of the two middle values when len(v) is even (for an integer type
// such as time.Duration that mean is truncated toward zero). It returns the
// zero value for an empty v. v itself is left unchanged.
func Median[T ~int64 | ~float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// MedianRatio returns the median of a[i]/b[i] over the pairs of a and b
// (the pairs of the longer one beyond the shorter's length are ignored). For
// figures measured side by side, a[i] in the same round as b[i], it cancels
// a drift between rounds that the ratio of the two medians would keep.
func MedianRatio(a, b []float64) float64 {
	r := make([]float64, min(len(a), len(b)))
	for i := range r {
		r[i] = a[i] / b[i]
	}
	return Median(r)
}

// MedianBy returns the element of xs whose key is the median: the middle
// element in key order, or the upper of the two middle ones when len(xs) is
// even (an element, not a mean, so that the other figures of that element,
// a whole round's, are reported together). It returns the zero T for an
// empty xs. xs itself is left unchanged.
func MedianBy[T any](xs []T, key func(T) float64) T {
	if len(xs) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(xs)
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return s[len(s)/2]
}
