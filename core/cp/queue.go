package cp

import (
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// Waiter is a waiting request as QueueReuse sees it: its id and prompt.
type Waiter struct {
	ID     string
	Tokens []config.Token
}

// QueueReuse returns, for each waiting request in the order given (oldest
// first), the cached blocks it will reuse as x reports them: PredictPrefixReuse
// registers the prompt and GetCPCachedBlocks answers, in chain order. It is
// what queue-aware eviction protects, and it is bounded: the distinct blocks
// of all the lists together are at most limit (a block two waiters share
// counts once). The waiter that reaches the limit keeps the head of its list
// that fits and later waiters get nothing, so a flood of waiters cannot
// claim more than limit blocks, and the oldest ones are served first.
// out[i] belongs to waiting[i]; it is nil when the waiter reuses nothing or
// the limit was reached before it.
func QueueReuse(x CPAwareKVManager, waiting []Waiter, limit int) [][]blockhash.Key {
	out := make([][]blockhash.Key, len(waiting))
	seen := map[blockhash.Key]struct{}{}
	for i, w := range waiting {
		if len(seen) >= limit {
			break
		}
		x.PredictPrefixReuse(w.ID, w.Tokens)
		keys := x.GetCPCachedBlocks(w.ID)
		n := 0
		for ; n < len(keys); n++ {
			if _, dup := seen[keys[n]]; dup {
				continue
			}
			if len(seen) == limit {
				break
			}
			seen[keys[n]] = struct{}{}
		}
		if n > 0 {
			out[i] = keys[:n:n]
		}
	}
	return out
}
