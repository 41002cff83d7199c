package cp

import (
	"slices"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// Tracker wires a manager's KV caches to a CPAwareKVManager: it creates
// caches whose block allocations and terminal frees are reported to the CP
// index.
//
//   - Create notifies the full blocks the new cache reuses (registration).
//   - Commit notifies the full blocks each commit completes.
//   - Close notifies, once, every block notified for the request, as a
//     terminal free.
//   - Resume, Suspend, Resize and any move between cache levels notify
//     nothing.
//
// Keys are the chained block hashes of package blockhash, equal to the keys
// of the manager's tree and of its cache events. Trailing partial blocks are
// never notified.
type Tracker struct {
	m  *core.Manager
	cp CPAwareKVManager
}

// NewTracker returns a Tracker; a nil cp is Null.
func NewTracker(m *core.Manager, cp CPAwareKVManager) *Tracker {
	if cp == nil {
		cp = Null{}
	}
	return &Tracker{m: m, cp: cp}
}

// CP returns the index the tracker notifies.
func (t *Tracker) CP() CPAwareKVManager { return t.cp }

// TrackedCache is a KVCache whose Commit and Close notify the CP index. The
// other methods are the KVCache's own (embedded) and notify nothing. Call
// Commit and Close on the TrackedCache, not on the embedded KVCache.
type TrackedCache struct {
	*core.KVCache
	t         *Tracker
	requestID string
	scope     blockhash.Scope
	hasher    *blockhash.Hasher
	last      blockhash.Key   // key of the last full committed block
	tail      []config.Token  // committed tokens after the last full block
	keys      []blockhash.Key // every key notified allocated
	known     []blockhash.Key // caller-given keys of leading blocks
	freed     bool
}

// Create creates a SUSPENDED cache for requestID (see core.Manager
// CreateKVCache) and notifies the full blocks it reuses.
func (t *Tracker) Create(requestID string, opts core.CacheOptions) (*TrackedCache, error) {
	return t.CreateWithKeys(requestID, opts, nil)
}

// CreateWithKeys is Create for a caller that already has the chain keys of
// some leading full blocks of the tokens it will commit (blockhash.Chain in
// opts.Scope): the tracker uses them instead of hashing those blocks again.
// The caller vouches for them.
func (t *Tracker) CreateWithKeys(requestID string, opts core.CacheOptions, keys []blockhash.Key) (*TrackedCache, error) {
	c, err := t.m.CreateKVCache(opts)
	if err != nil {
		return nil, err
	}
	tc, added := t.wrap(requestID, c, opts, keys)
	if len(added) > 0 {
		t.cp.NotifyBlocksAllocated(requestID, added)
	}
	return tc, nil
}

// Wrap tracks a cache the caller created with t's manager and opts (for a
// caller that must create it under a lock of its own): it returns the
// tracked cache and the keys of the full blocks the cache reuses, which the
// caller must notify allocated (t.CP().NotifyBlocksAllocated, skipped when
// empty) before any Commit or Close of the tracked cache, preferably without
// holding locks an index's callbacks could need.
func (t *Tracker) Wrap(requestID string, c *core.KVCache, opts core.CacheOptions) (*TrackedCache, []blockhash.Key) {
	return t.wrap(requestID, c, opts, nil)
}

func (t *Tracker) wrap(requestID string, c *core.KVCache, opts core.CacheOptions, keys []blockhash.Key) (*TrackedCache, []blockhash.Key) {
	tc := &TrackedCache{
		KVCache: c, t: t, requestID: requestID, scope: opts.Scope,
		hasher: blockhash.NewHasher(), last: opts.Scope.Root(), known: keys,
	}
	return tc, tc.extend(opts.InputTokens[:c.ReusedTokens()])
}

// RequestID returns the id the cache was created for.
func (tc *TrackedCache) RequestID() string { return tc.requestID }

// Keys returns the keys notified allocated so far, in chain order.
func (tc *TrackedCache) Keys() []blockhash.Key { return slices.Clone(tc.keys) }

// extend appends committed tokens and returns the keys of the full blocks
// they complete.
func (tc *TrackedCache) extend(tokens []config.Token) []blockhash.Key {
	tpb := tc.t.m.TokensPerBlock()
	var added []blockhash.Key
	for len(tokens) > 0 {
		n := min(tpb-len(tc.tail), len(tokens))
		if len(tc.tail) == 0 && n == tpb {
			// Whole block straight from the input: no copy.
			if b := len(tc.keys) + len(added); b < len(tc.known) {
				tc.last = tc.known[b]
			} else {
				tc.last = tc.hasher.Next(tc.last, tokens[:tpb])
			}
			added = append(added, tc.last)
			tokens = tokens[tpb:]
			continue
		}
		tc.tail = append(tc.tail, tokens[:n]...)
		tokens = tokens[n:]
		if len(tc.tail) == tpb {
			if b := len(tc.keys) + len(added); b < len(tc.known) {
				tc.last = tc.known[b]
			} else {
				tc.last = tc.hasher.Next(tc.last, tc.tail)
			}
			added = append(added, tc.last)
			tc.tail = tc.tail[:0]
		}
	}
	tc.keys = append(tc.keys, added...)
	return added
}

// Commit commits tokens (see core.KVCache.Commit) and, on success, notifies
// the full blocks they complete.
func (tc *TrackedCache) Commit(tokens []config.Token, isEnd bool) error {
	if err := tc.KVCache.Commit(tokens, isEnd); err != nil {
		return err
	}
	tc.notifyCommitted(tokens)
	return nil
}

// notifyCommitted notifies the full blocks the cache's committed length
// newly reaches through tokens, those just committed. The tracker holds the
// chain up to the length it has seen; only a fresh run's commits commit
// tokens it holds already (the run's blocks were notified at creation with
// the rest of the matched prefix, which the run's completion joins).
func (tc *TrackedCache) notifyCommitted(tokens []config.Token) {
	held := len(tc.keys)*tc.t.m.TokensPerBlock() + len(tc.tail)
	n := tc.KVCache.NumCommittedTokens() - held
	if n <= 0 {
		return
	}
	if added := tc.extend(tokens[len(tokens)-min(n, len(tokens)):]); len(added) > 0 {
		tc.t.cp.NotifyBlocksAllocated(tc.requestID, added)
	}
}

// DecodeSteps applies one-token decode steps (see core.KVCache.DecodeSteps)
// and notifies the full blocks the steps that applied complete (all of
// them on success).
func (tc *TrackedCache) DecodeSteps(tokens []config.Token) error {
	before := tc.KVCache.NumCommittedTokens()
	err := tc.KVCache.DecodeSteps(tokens)
	if applied := tc.KVCache.NumCommittedTokens() - before; applied > 0 {
		tc.notifyCommitted(tokens[:applied])
	}
	return err
}

// CommitBeamSearch commits tokens after a beam search step (see
// core.KVCache.CommitBeamSearch) and, on success, notifies the full blocks
// they complete.
func (tc *TrackedCache) CommitBeamSearch(tokens []config.Token, beamSearchIndices []int, isEnd bool) error {
	if err := tc.KVCache.CommitBeamSearch(tokens, beamSearchIndices, isEnd); err != nil {
		return err
	}
	tc.notifyCommitted(tokens)
	return nil
}

// Close closes the cache (see core.KVCache.Close) and, the first time it
// succeeds, notifies the terminal free of every block notified allocated.
func (tc *TrackedCache) Close() error {
	if err := tc.KVCache.Close(); err != nil {
		return err
	}
	if !tc.freed {
		tc.freed = true
		tc.t.cp.NotifyBlocksFreed(tc.requestID, slices.Clone(tc.keys))
	}
	return nil
}
