// Package cp is kvcm's CP-aware KV management interface: the five methods a
// scheduler and a KV allocator use to ask a prefix-reuse index ("CP", after
// ContextPilot) what a request would reuse, and to keep that index in step
// with allocation and terminal frees.
//
// Block identity is the chained content hash of package blockhash, the same
// key the manager's radix tree uses, in every language binding.
//
// Three implementations:
//   - Null: zero scores, identity order, no state. Enabling it changes nothing.
//   - ManagerBacked: scores from the manager's own block index across cache
//     levels, kept exact by the manager's cache events.
//   - Delegating: wraps an external index whose methods may be missing, and
//     never lets it break scheduling.
//
// Every method of every implementation here is safe for concurrent use and
// never panics on any input.
//
// Bindings: the C ABI (kvcm_cp_*, see capi/glue_cp.go) exposes every
// implementation as a kvcm_cp_index handle. An external index is a
// kvcm_cp_index_vtable whose method slots may be null: each slot takes plain
// data (a request id with its length, a token array, a block-key array) and
// returns 0 or a failure code; it becomes an External whose missing slots are
// nil funcs and whose failures are errors, wrapped by Delegating. The C++
// binding fills the slots a class overrides, the Python binding those a
// middleware has (getattr + callable). kvcm_manager_attach_cp wires a Tracker
// into the C manager's caches.
//
// Wiring: Tracker creates KV caches that notify allocations (reused blocks
// at creation, completed blocks at each commit) and terminal frees (close)
// to an index; package sched orders admissions with GetAllocationPriority.
package cp

import (
	"math"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// CPAwareKVManager is the CP-aware KV management interface.
//
// A request is named by an id string that is unique among live requests.
// Implementations must be safe for concurrent use, must not retain the
// slices passed to them beyond the call unless documented, and must not
// panic.
type CPAwareKVManager interface {
	// PredictPrefixReuse returns the predicted fraction of tokens whose KV
	// can be reused for the request, in [0, 1] (never NaN). It may register
	// the request's tokens so that GetAllocationPriority and
	// GetCPCachedBlocks can answer for requestID later.
	PredictPrefixReuse(requestID string, tokens []config.Token) float64

	// GetCPCachedBlocks returns the keys of blocks the index knows to be
	// cached for the request, in chain order, as hints an allocator may map
	// to its own block ids. Unknown requests get nil.
	GetCPCachedBlocks(requestID string) []blockhash.Key

	// NotifyBlocksAllocated tells the index that the request holds these
	// blocks: called on allocation and on registration (commit) of blocks.
	NotifyBlocksAllocated(requestID string, keys []blockhash.Key)

	// NotifyBlocksFreed tells the index that the request released these
	// blocks for good: called on terminal frees only (finish, abort).
	// Suspend/resume, swaps and moves between cache levels never call it.
	// The request is forgotten afterwards; the blocks may stay cached.
	NotifyBlocksFreed(requestID string, keys []blockhash.Key)

	// GetAllocationPriority returns requestIDs reordered from highest to
	// lowest predicted overlap with the cache. The result is always a
	// permutation of requestIDs (same elements, same multiplicity); ties
	// keep the input order.
	GetAllocationPriority(requestIDs []string) []string
}

// Generational is implemented by indexes that can tell when their scores may
// have changed. Generation returns a value that changes whenever a score
// previously returned by PredictPrefixReuse may have changed (the cache
// changed under it); while it stays equal, a caller may keep using the scores
// it has instead of asking again. Requests never scored before must be scored
// regardless.
type Generational interface {
	Generation() uint64
}

// ScoreReleaser is implemented by indexes that track requests for scoring.
// ReleaseScore says the caller will ask for no more scores of requestID (for
// example because it has been admitted): the index may stop watching it for
// score changes. GetCPCachedBlocks keeps answering until NotifyBlocksFreed.
type ScoreReleaser interface {
	ReleaseScore(requestID string)
}

// Null is the CP-disabled implementation: every score is 0, every order is
// the input order, no state is kept, notifications are ignored. A scheduler
// using Null behaves exactly as without a CP index.
type Null struct{}

var _ CPAwareKVManager = Null{}

// PredictPrefixReuse returns 0.
func (Null) PredictPrefixReuse(string, []config.Token) float64 { return 0 }

// GetCPCachedBlocks returns nil.
func (Null) GetCPCachedBlocks(string) []blockhash.Key { return nil }

// NotifyBlocksAllocated does nothing.
func (Null) NotifyBlocksAllocated(string, []blockhash.Key) {}

// NotifyBlocksFreed does nothing.
func (Null) NotifyBlocksFreed(string, []blockhash.Key) {}

// GetAllocationPriority returns a copy of requestIDs in the same order.
func (Null) GetAllocationPriority(requestIDs []string) []string {
	if requestIDs == nil {
		return nil
	}
	return append([]string(nil), requestIDs...)
}

// Generation is always 0: Null scores never change.
func (Null) Generation() uint64 { return 0 }

// ClampScore maps any float64 into [0, 1]: NaN and values below 0 become 0,
// values above 1 (including +Inf) become 1.
func ClampScore(x float64) float64 {
	switch {
	case math.IsNaN(x) || x <= 0:
		return 0
	case x >= 1:
		return 1
	}
	return x
}

// RepairOrder turns order, a proposed ordering of ids, into a permutation of
// ids: it keeps the elements of order that ids contains (each at most as many
// times as ids does) in order's sequence, drops the rest, and appends what is
// missing in ids' order. If order already is a permutation it is returned
// unchanged (as a copy).
func RepairOrder(ids, order []string) []string {
	if ids == nil {
		return nil
	}
	left := make(map[string]int, len(ids))
	for _, id := range ids {
		left[id]++
	}
	out := make([]string, 0, len(ids))
	for _, id := range order {
		if left[id] > 0 {
			left[id]--
			out = append(out, id)
		}
	}
	if len(out) == len(ids) {
		return out
	}
	for _, id := range ids {
		if left[id] > 0 {
			left[id]--
			out = append(out, id)
		}
	}
	return out
}
