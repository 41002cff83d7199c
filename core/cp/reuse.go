package cp

import (
	"container/heap"
	"fmt"
	"math"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
)

// ReuseOptions configures ReuseEvict: how the reuse a scheduler observes
// becomes eviction priority.
type ReuseOptions struct {
	// OneOff is the priority of a block left cached that no request has
	// reused since it was computed: evicted first, at every level.
	OneOff int
	// Base is the priority of a reused block outside the raised set (below).
	Base int
	// Step is the priority added per doubling of a block's decayed reuse
	// count: a block reused c times (decayed) ranks at
	// Base + round(Step × log2 c), at most Max.
	Step float64
	// Max is the highest priority a reused block gets.
	Max int
	// HalfLife is how many admissions it takes a reuse count to halve.
	HalfLife int
	// Limit is the most blocks ranked above Base at once. Past it the
	// blocks of lowest decayed count go back to Base, so stale popularity
	// cannot hold the cache.
	Limit int
}

// DefaultReuseOptions: one-off blocks at 15, reused ones from the default
// priority 35 up to 65 (below queue-aware eviction's 70) by 4 per doubling
// of a count that halves every 1024 admissions, at most limit blocks raised.
func DefaultReuseOptions(limit int) ReuseOptions {
	return ReuseOptions{OneOff: 15, Base: core.DefaultPriority, Step: 4, Max: 65, HalfLife: 1024, Limit: limit}
}

// Validate checks OneOff ≤ Base ≤ Max within the manager's priorities, a
// positive step and half-life and a limit not negative.
func (o ReuseOptions) Validate() error {
	switch {
	case o.OneOff < core.MinPriority || o.OneOff > o.Base:
		return fmt.Errorf("cp: reuse eviction one-off priority %d must be in [%d, base %d]", o.OneOff, core.MinPriority, o.Base)
	case o.Base > o.Max || o.Max > core.MaxPriority:
		return fmt.Errorf("cp: reuse eviction max priority %d must be in [base %d, %d]", o.Max, o.Base, core.MaxPriority)
	case !(o.Step > 0):
		return fmt.Errorf("cp: reuse eviction step %v must be positive", o.Step)
	case o.HalfLife < 1:
		return fmt.Errorf("cp: reuse eviction half-life %d must be at least 1 admission", o.HalfLife)
	case o.Limit < 0:
		return fmt.Errorf("cp: reuse eviction limit %d must not be negative", o.Limit)
	}
	return nil
}

// PriorityUpdate is one core.Manager.SetBlockPriorities call: a chain of
// block keys, first block first, and a priority for each.
type PriorityUpdate struct {
	Chain      []blockhash.Key
	Priorities []int
}

// ReuseEvict is eviction that knows the workload's reuse: a scheduler tells
// it which cached blocks each admitted request reuses and which blocks a
// finished request leaves cached, and applies the priorities it returns
// with core.Manager.SetBlockPriorities (the C ABI's
// kvcm_manager_set_block_priorities). The manager evicts by priority first,
// at every level, so:
//
//   - a block nobody has reused since it was computed (a one-off question,
//     a generated answer, a prefix seen once) gets OneOff and goes first;
//   - a reused block ranks by its reuse count, decayed by half every
//     HalfLife admissions: popular prefixes stay on the GPU and host, and
//     the ones whose popularity faded sink back;
//   - at most Limit blocks rank above Base; past it the blocks of lowest
//     decayed count (the deepest of a chain first) return to Base.
//
// Counts only grow towards a chain's root (a block is reused whenever a
// block after it is), so the priorities it returns keep the tree's rule
// that an ancestor never ranks below a descendant. It keeps one entry per
// block it was told about; Removed forgets a block the manager dropped. Not
// safe for concurrent use.
type ReuseEvict struct {
	o          ReuseOptions
	admissions int
	blocks     map[blockhash.Key]*reuseBlock
	raised     raisedHeap
	nextChain  int
}

type reuseBlock struct {
	// score is log2 of the reuse count decayed to admission 0 (counts
	// decay alike, so its order is the order of the decayed counts now);
	// -Inf for a block never reused.
	score    float64
	priority int
	// chain reaches the block from the root (the chain it was last reused
	// on), chainID names that chain, depth is its index in it.
	chain   []blockhash.Key
	chainID int
	depth   int
	heapIdx int
}

// NewReuseEvict returns the policy with options o (see Validate).
func NewReuseEvict(o ReuseOptions) (*ReuseEvict, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &ReuseEvict{o: o, blocks: map[blockhash.Key]*reuseBlock{}}, nil
}

// Admitted records that a request was admitted reusing the cached blocks
// chain (its reused prefix, first block first) and returns the updates to
// apply: the chain's new priorities, then those of blocks the limit sent
// back to Base.
func (r *ReuseEvict) Admitted(chain []blockhash.Key) []PriorityUpdate {
	r.admissions++
	if len(chain) == 0 {
		return nil
	}
	now := float64(r.admissions) / float64(r.o.HalfLife)
	id := r.nextChain
	r.nextChain++
	for i, k := range chain {
		b := r.blocks[k]
		if b == nil {
			b = &reuseBlock{score: math.Inf(-1), heapIdx: -1}
			r.blocks[k] = b
		}
		// count now = 2^(score − now); one more reuse.
		c := math.Exp2(b.score-now) + 1
		b.score = math.Log2(c) + now
		b.chain, b.chainID, b.depth = chain[:i+1], id, i
		b.priority = min(r.o.Base+int(math.Round(r.o.Step*math.Log2(c))), r.o.Max)
		r.rank(b)
	}
	lowered := r.trim(id)
	return append([]PriorityUpdate{r.update(chain)}, lowered...)
}

// update sets chain at the priorities the policy gives its blocks now.
func (r *ReuseEvict) update(chain []blockhash.Key) PriorityUpdate {
	prs := make([]int, len(chain))
	for i, k := range chain {
		prs[i] = r.o.Base
		if b := r.blocks[k]; b != nil {
			prs[i] = b.priority
		}
	}
	return PriorityUpdate{Chain: chain, Priorities: prs}
}

// Released records that a finished request left the blocks of chain
// cached (all it committed, first block first) and returns their
// priorities: a block reused since it was computed keeps its own, any
// other one gets OneOff.
func (r *ReuseEvict) Released(chain []blockhash.Key) PriorityUpdate {
	for _, k := range chain {
		if r.blocks[k] == nil {
			r.blocks[k] = &reuseBlock{score: math.Inf(-1), priority: r.o.OneOff, heapIdx: -1}
		}
	}
	return r.update(chain)
}

// Removed forgets a block the manager no longer holds.
func (r *ReuseEvict) Removed(k blockhash.Key) {
	b := r.blocks[k]
	if b == nil {
		return
	}
	if b.heapIdx >= 0 {
		heap.Remove(&r.raised, b.heapIdx)
	}
	delete(r.blocks, k)
}

// Priority returns the priority the policy gives k, and whether it knows k.
func (r *ReuseEvict) Priority(k blockhash.Key) (int, bool) {
	if b := r.blocks[k]; b != nil {
		return b.priority, true
	}
	return 0, false
}

// Raised returns how many blocks rank above Base now.
func (r *ReuseEvict) Raised() int { return len(r.raised) }

// rank keeps b in the raised set while it ranks above Base.
func (r *ReuseEvict) rank(b *reuseBlock) {
	switch {
	case b.priority > r.o.Base && b.heapIdx >= 0:
		heap.Fix(&r.raised, b.heapIdx)
	case b.priority > r.o.Base:
		heap.Push(&r.raised, b)
	case b.heapIdx >= 0:
		heap.Remove(&r.raised, b.heapIdx)
	}
}

// trim sends the raised blocks of lowest decayed count back to Base until
// at most Limit remain, and returns the updates: one a chain, set along
// the chain as far as its deepest lowered block, every block at the
// priority the policy gives it; none for chain current, whose update
// covers it.
func (r *ReuseEvict) trim(current int) []PriorityUpdate {
	deepest := map[int]*reuseBlock{}
	var order []int
	for len(r.raised) > r.o.Limit {
		b := heap.Pop(&r.raised).(*reuseBlock)
		b.priority = r.o.Base
		if b.chainID == current {
			continue
		}
		if d, ok := deepest[b.chainID]; !ok || b.depth > d.depth {
			if !ok {
				order = append(order, b.chainID)
			}
			deepest[b.chainID] = b
		}
	}
	out := make([]PriorityUpdate, 0, len(order))
	for _, id := range order {
		out = append(out, r.update(deepest[id].chain))
	}
	return out
}

// raisedHeap orders raised blocks lowest decayed count first, the deepest
// first among equal counts.
type raisedHeap []*reuseBlock

func (h raisedHeap) Len() int { return len(h) }
func (h raisedHeap) Less(i, j int) bool {
	if h[i].score != h[j].score {
		return h[i].score < h[j].score
	}
	return h[i].depth > h[j].depth
}
func (h raisedHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *raisedHeap) Push(x any) {
	b := x.(*reuseBlock)
	b.heapIdx = len(*h)
	*h = append(*h, b)
}
func (h *raisedHeap) Pop() any {
	old := *h
	b := old[len(old)-1]
	old[len(old)-1] = nil
	b.heapIdx = -1
	*h = old[:len(old)-1]
	return b
}
