package abimodel

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// An external index's get_allocation_priority answers indices into the
// ids; they become the order, indices out of range (what the slot left
// unwritten) are dropped and the order repaired (omitted ids follow in
// input order), counting a fault.
func TestExternalIndexOrderIsIndicesIntoTheIDs(t *testing.T) {
	var got [][]RequestID
	answer := []uint64{2, 0, 1}
	x := NewExternalIndex(ExternalCP{GetAllocationPriority: func(ids []RequestID) ([]uint64, error) {
		got = append(got, ids)
		return answer, nil
	}})
	defer x.Destroy()
	order, err := x.GetAllocationPriority(requestIDs("a", "b", "c"))
	require.NoError(t, err)
	assert.Equal(t, []int{2, 0, 1}, order)
	assert.Equal(t, [][]RequestID{{{"a"}, {"b"}, {"c"}}}, got)
	assert.Zero(t, mustFaults(t, x))

	answer = []uint64{2, ^uint64(0), 3}
	order, err = x.GetAllocationPriority(requestIDs("a", "b", "c"))
	require.NoError(t, err)
	assert.Equal(t, []int{2, 0, 1}, order, "out of range dropped, the omitted appended")
	assert.Equal(t, uint64(1), mustFaults(t, x))

	got = nil
	order, err = x.GetAllocationPriority(nil)
	require.NoError(t, err)
	assert.Empty(t, order)
	assert.Empty(t, got, "no ids: the slot is not called")
}

// Missing slots answer as the null index; a failing slot answers as the
// null index too and counts a fault.
func TestExternalIndexMissingAndFailingSlots(t *testing.T) {
	x := NewExternalIndex(ExternalCP{})
	defer x.Destroy()
	score, err := x.PredictPrefixReuse("r", []config.Token{1, 2})
	require.NoError(t, err)
	assert.Zero(t, score)
	order, err := x.GetAllocationPriority(requestIDs("a", "b"))
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, order)
	require.NoError(t, x.NotifyBlocksAllocated("r", []blockhash.Key{1}))
	assert.Zero(t, mustFaults(t, x))

	fail := errors.New("slot returned 1")
	y := NewExternalIndex(ExternalCP{
		GetCPCachedBlocks:     func(string) ([]blockhash.Key, error) { return nil, fail },
		GetAllocationPriority: func([]RequestID) ([]uint64, error) { return nil, fail },
	})
	defer y.Destroy()
	keys, err := y.GetCachedBlocks("r")
	require.NoError(t, err)
	assert.Empty(t, keys)
	order, err = y.GetAllocationPriority(requestIDs("a", "b"))
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, order)
	assert.Equal(t, uint64(2), mustFaults(t, y))
}

// Destroy runs once, when the last reference goes: after the creator's
// Destroy when no manager holds the index.
func TestExternalIndexDestroysOnce(t *testing.T) {
	destroys := 0
	x := NewExternalIndex(ExternalCP{Destroy: func() { destroys++ }})
	require.NoError(t, x.Destroy())
	assert.Error(t, x.Destroy())
	assert.Equal(t, 1, destroys)
	assert.True(t, x.Closed())
}

func mustFaults(t *testing.T, x *CPIndex) uint64 {
	t.Helper()
	n, err := x.FaultCount()
	require.NoError(t, err)
	return n
}

func requestIDs(ids ...string) []RequestID {
	out := make([]RequestID, len(ids))
	for i, id := range ids {
		out[i].ID = id
	}
	return out
}
