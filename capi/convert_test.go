package capi

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// An input array converts element by element as Go's conversion does,
// whether it is copied at once (integers of one width) or one at a time.
func TestConvertNumbersIsGoConversion(t *testing.T) {
	type token int32
	same := []int32{0, -1, math.MinInt32, math.MaxInt32, 7}
	tokens := make([]token, len(same))
	convertNumbers(tokens, same)
	assert.Equal(t, []token{0, -1, math.MinInt32, math.MaxInt32, 7}, tokens)

	unsigned := make([]uint32, len(same))
	convertNumbers(unsigned, same)
	assert.Equal(t, []uint32{0, math.MaxUint32, 1 << 31, math.MaxInt32, 7}, unsigned, "one width: the bits, reinterpreted")

	wide := make([]int64, len(same))
	convertNumbers(wide, same)
	assert.Equal(t, []int64{0, -1, math.MinInt32, math.MaxInt32, 7}, wide, "widening keeps the sign")

	floats := make([]float32, 2)
	convertNumbers(floats, []int32{3, -2})
	assert.Equal(t, []float32{3, -2}, floats, "int to float converts the value, not the bits")

	ints := make([]int32, 2)
	convertNumbers(ints, []float32{2.75, -1.5})
	assert.Equal(t, []int32{2, -1}, ints, "float to int truncates")

	convertNumbers([]int32{}, []int32{})
}
