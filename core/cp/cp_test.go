package cp

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNullHasZeroScoresIdentityOrderAndNoState(t *testing.T) {
	var n Null
	assert.Zero(t, n.PredictPrefixReuse("a", seq(0, 100)))
	n.NotifyBlocksAllocated("a", nil)
	assert.Nil(t, n.GetCPCachedBlocks("a"))
	ids := []string{"c", "a", "b", "a"}
	got := n.GetAllocationPriority(ids)
	assert.Equal(t, ids, got)
	got[0] = "x"
	assert.Equal(t, "c", ids[0], "the result is a copy")
	assert.Nil(t, n.GetAllocationPriority(nil))
	assert.Zero(t, n.Generation())
}

func TestClampScore(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{
		{math.NaN(), 0}, {math.Inf(-1), 0}, {-0.5, 0}, {0, 0}, {0.25, 0.25}, {1, 1}, {1.5, 1}, {math.Inf(1), 1},
	} {
		assert.Equal(t, c.want, ClampScore(c.in), "clamp(%v)", c.in)
	}
}

func TestRepairOrderAlwaysReturnsAPermutation(t *testing.T) {
	ids := []string{"a", "b", "c", "b"}
	cases := []struct {
		name  string
		order []string
		want  []string
	}{
		{"valid permutation kept", []string{"c", "b", "a", "b"}, []string{"c", "b", "a", "b"}},
		{"omitted ids appended in input order", []string{"c"}, []string{"c", "a", "b", "b"}},
		{"invented ids dropped", []string{"zz", "b", "q"}, []string{"b", "a", "b", "c"}},
		{"extra duplicates dropped", []string{"a", "a", "a", "c", "b", "b", "b"}, []string{"a", "c", "b", "b"}},
		{"nil order is input order", nil, []string{"a", "b", "c", "b"}},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, RepairOrder(ids, c.order), c.name)
	}
	assert.Nil(t, RepairOrder(nil, []string{"a"}))
}
