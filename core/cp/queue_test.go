package cp

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// fixedIndex answers GetCPCachedBlocks from a table and records which
// requests it was asked to register.
type fixedIndex struct {
	Null
	blocks     map[string][]blockhash.Key
	registered []string
}

func (f *fixedIndex) PredictPrefixReuse(id string, _ []config.Token) float64 {
	f.registered = append(f.registered, id)
	return 0
}

func (f *fixedIndex) GetCPCachedBlocks(id string) []blockhash.Key { return f.blocks[id] }

func keys(ks ...uint64) []blockhash.Key {
	out := make([]blockhash.Key, len(ks))
	for i, k := range ks {
		out[i] = blockhash.Key(k)
	}
	return out
}

// QueueReuse lists each waiter's cached blocks, oldest first, registering
// each prompt with the index first.
func TestQueueReuseListsEachWaitersCachedBlocks(t *testing.T) {
	x := &fixedIndex{blocks: map[string][]blockhash.Key{"a": keys(1, 2), "c": keys(1, 3)}}
	got := QueueReuse(x, []Waiter{{ID: "a"}, {ID: "b"}, {ID: "c"}}, 10)
	assert.Equal(t, [][]blockhash.Key{keys(1, 2), nil, keys(1, 3)}, got)
	assert.Equal(t, []string{"a", "b", "c"}, x.registered)
}

// The distinct blocks of all lists never exceed the limit, shared blocks
// count once, the oldest waiters come first and the one that reaches the
// limit keeps the head of its list: a flood of waiters cannot claim more.
func TestQueueReuseIsBoundedByTheLimitOldestFirst(t *testing.T) {
	x := &fixedIndex{blocks: map[string][]blockhash.Key{}}
	var ws []Waiter
	for i := range 1000 {
		id := string(rune('a'+i%26)) + string(rune('a'+i/26))
		x.blocks[id] = keys(1, 2, uint64(100+i), uint64(5000+i))
		ws = append(ws, Waiter{ID: id})
	}
	got := QueueReuse(x, ws, 7)
	distinct := map[blockhash.Key]bool{}
	for _, l := range got {
		for _, k := range l {
			distinct[k] = true
		}
	}
	assert.Len(t, distinct, 7)
	assert.Equal(t, keys(1, 2, 100, 5000), got[0])
	assert.Equal(t, keys(1, 2, 101, 5001), got[1], "1 and 2 count once")
	assert.Equal(t, keys(1, 2, 102), got[2], "the head that fits")
	assert.Nil(t, got[3])
	assert.Len(t, x.registered, 3, "waiters past the limit are not even asked")
	assert.Nil(t, QueueReuse(x, ws, 0)[0], "limit 0 protects nothing")
}
