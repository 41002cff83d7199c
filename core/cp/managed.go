package cp

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// DefaultLevelWeights are the level discounts ManagerBacked uses by default:
// a block cached on the GPU saves all of its recompute, one on the host tier
// half (it must be copied back), one on disk a quarter. They are a ranking
// heuristic, not a measurement.
var DefaultLevelWeights = []float64{1, 0.5, 0.25}

// ManagerBackedOptions configures NewManagerBacked.
type ManagerBackedOptions struct {
	// LevelWeights[l] is the fraction of a block's recompute cost that reuse
	// saves when the block is cached on level l (0 = GPU). Levels past the
	// end use the last weight. Empty selects DefaultLevelWeights. Weights are
	// clamped into [0, 1].
	LevelWeights []float64
	// ScopeOf returns a request's reuse scope; nil means the zero scope for
	// every request.
	ScopeOf func(requestID string) blockhash.Scope
	// KnownChain, if set, may return the chain keys of a request's prompt
	// blocks (blockhash.Chain of its tokens in its scope; any number of
	// leading blocks) when the caller has them already, sparing the index
	// the hashing. nil lets the index hash. The caller vouches for them.
	KnownChain func(requestID string) []blockhash.Key
}

// ManagerBacked scores requests from the manager's real block index: what is
// cached now, at which cache level, whatever request made it. It mirrors the
// manager's radix tree from the manager's cache events (stored, removed,
// level changed), so a block that outlives the request that computed it
// keeps counting until the manager evicts it, and a block evicted while its
// request still runs stops counting at once.
//
// Score: the request's tokens are cut into full blocks and chained with
// blockhash; the longest prefix of those blocks present in the index is the
// reusable prefix (all of the tokens when all of them are cached, less the
// manager's reuse match backoff rounded out to whole blocks). Each
// block counts its tokens times the mean, over layer groups, of the weight of
// the level its page is on. The score is that sum over len(tokens).
//
// A layer group's page dropped while the block keeps others arrives as a
// BlockUpdated event at core.DroppedLevel: the page stops counting, and the
// block's weight is the mean over the pages it still has.
//
// With more than one layer group (sliding-window layouts) the events still do
// not say which pages a block has: a cache may publish a block whose windowed
// page it already released (Resize before Commit), announced by a plain
// BlockStored, and a cache that publishes an equal block fills the pages the
// tree's block had lost with an update to a level the mirror already shows. Neither can be mirrored, so the
// index caps the reusable prefix with Manager.ProbeReuse, which is exact but
// costs one hash walk per score. (Two events in core would make the probe
// unnecessary: a DroppedLevel update for each page a stored block lacks, and
// a level update for each page filled into an existing block.)
//
// Scores are memoized per request and recomputed only after an event touched
// one of the request's blocks; Generation changes exactly then.
//
// Wire it with NewManagerWithIndex, or pass Listener() to core.NewManager
// with core.WithEventListener and call Attach on the new manager before any
// cache is created.
type ManagerBacked struct {
	weights []float64
	scopeOf func(string) blockhash.Scope
	known   func(string) []blockhash.Key

	// evMu guards pending only. The listener runs with the manager's lock
	// held, so it takes nothing else; lock order is mu → manager → evMu.
	evMu    sync.Mutex
	pending []core.CacheEvent

	mu  sync.Mutex
	m   *core.Manager
	tpb int
	// backoff is the manager's Config.ReuseMatchBackoff.
	backoff int
	numLG   int
	probe   bool
	blocks  map[blockhash.Key]*blockEntry
	reqs    map[string]*reqState
	watch   map[blockhash.Key][]*reqState
	gen     uint64
	scores  uint64
}

type blockEntry struct {
	parent blockhash.Key
	levels []int32 // per layer group
}

type reqState struct {
	id     string
	n      int // number of tokens
	scope  blockhash.Scope
	tokens []config.Token // kept only when probing
	chain  []blockhash.Key
	// prompt: tokens were registered by PredictPrefixReuse.
	prompt bool
	// watched: in the watch index, its score is kept up to date.
	watched bool
	scored  bool
	dirty   bool
	score   float64
	alloc   []blockhash.Key
	allocd  map[blockhash.Key]struct{}
}

var (
	_ CPAwareKVManager = (*ManagerBacked)(nil)
	_ Generational     = (*ManagerBacked)(nil)
	_ ScoreReleaser    = (*ManagerBacked)(nil)
)

// NewManagerBacked returns an index not yet attached to a manager.
func NewManagerBacked(opts ManagerBackedOptions) *ManagerBacked {
	w := opts.LevelWeights
	if len(w) == 0 {
		w = DefaultLevelWeights
	}
	weights := make([]float64, len(w))
	for i, x := range w {
		weights[i] = ClampScore(x)
	}
	return &ManagerBacked{
		weights: weights,
		scopeOf: opts.ScopeOf,
		known:   opts.KnownChain,
		blocks:  map[blockhash.Key]*blockEntry{},
		reqs:    map[string]*reqState{},
		watch:   map[blockhash.Key][]*reqState{},
	}
}

// NewManagerWithIndex creates a manager with a ManagerBacked index listening
// to its events from the start, and attaches the index.
func NewManagerWithIndex(cfg config.Config, opts ManagerBackedOptions, coreOpts ...core.Option) (*core.Manager, *ManagerBacked, error) {
	if cfg.BlockKey != blockhash.SHA256 {
		return nil, nil, &config.Error{Field: "block_key", Msg: fmt.Sprintf(
			"the CP-aware index names blocks by their sha256 keys, got %v", cfg.BlockKey)}
	}
	x := NewManagerBacked(opts)
	m, err := core.NewManager(cfg, append(coreOpts, core.WithEventListener(x.Listener()))...)
	if err != nil {
		return nil, nil, err
	}
	x.Attach(m)
	return m, x, nil
}

// Listener returns the event listener to register with
// core.WithEventListener. It only queues events; they are applied on the
// index's next call.
func (x *ManagerBacked) Listener() core.EventListener {
	return func(e core.CacheEvent) {
		x.evMu.Lock()
		x.pending = append(x.pending, e)
		x.evMu.Unlock()
	}
}

// Attach binds the index to the manager whose events its listener receives.
// Until then every score is 0. Attach once. The manager must key blocks with
// blockhash.SHA256 (config.Config.BlockKey), the keys the index computes.
func (x *ManagerBacked) Attach(m *core.Manager) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.m = m
	x.tpb = m.TokensPerBlock()
	x.backoff = m.ReuseMatchBackoff()
	x.numLG = m.NumLayerGroups()
	x.probe = x.numLG > 1
}

// Generation changes whenever a cache event touched a block of a request
// whose score was returned and is still watched (see Generational).
func (x *ManagerBacked) Generation() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.drain()
	return x.gen
}

// ScoreComputations counts how many scores were computed rather than served
// from the memo: a measure of the index's work.
func (x *ManagerBacked) ScoreComputations() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.scores
}

// NumBlocks returns how many blocks the index knows to be cached.
func (x *ManagerBacked) NumBlocks() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.drain()
	return len(x.blocks)
}

// BlockLevels returns the cache level of each layer group's page of a cached
// block (core.DroppedLevel for a page it no longer has), and whether the
// block is cached.
func (x *ManagerBacked) BlockLevels(key blockhash.Key) ([]int32, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.drain()
	e := x.blocks[key]
	if e == nil {
		return nil, false
	}
	return slices.Clone(e.levels), true
}

// drain applies queued events. Caller holds mu.
func (x *ManagerBacked) drain() {
	if x.m == nil {
		return
	}
	x.evMu.Lock()
	evs := x.pending
	x.pending = nil
	x.evMu.Unlock()
	changed := false
	for _, e := range evs {
		switch e.Kind {
		case core.BlockStored:
			b := x.blocks[e.Key]
			if b == nil {
				b = &blockEntry{parent: e.Parent, levels: make([]int32, x.numLG)}
				x.blocks[e.Key] = b
			}
			clear(b.levels)
		case core.BlockRemoved:
			delete(x.blocks, e.Key)
		case core.BlockUpdated:
			b := x.blocks[e.Key]
			if b == nil || int(e.LayerGroup) < 0 || int(e.LayerGroup) >= len(b.levels) {
				continue
			}
			lv := int32(e.Level)
			if e.Level < 0 {
				lv = droppedLevel
			}
			// With several layer groups a page may come back at the level
			// the mirror already shows (it was stored without it): the
			// probed prefix can change anyway, so watchers are told.
			if b.levels[e.LayerGroup] == lv && !x.probe {
				continue
			}
			b.levels[e.LayerGroup] = lv
		default:
			continue
		}
		for _, r := range x.watch[e.Key] {
			if r.scored && !r.dirty {
				r.dirty = true
				changed = true
			}
		}
	}
	if changed {
		x.gen++
	}
}

// droppedLevel marks a layer group's page the block no longer has.
const droppedLevel = int32(core.DroppedLevel)

// weight is the mean, over the pages the block has, of their levels'
// weights. Dropped pages do not count: a page the reuse needs is never
// dropped within the reusable prefix (ProbeReuse caps it), and one it does
// not need costs nothing to bring back.
func (x *ManagerBacked) weight(b *blockEntry) float64 {
	var s float64
	n := 0
	for _, l := range b.levels {
		if l < 0 {
			continue
		}
		s += x.weights[min(int(l), len(x.weights)-1)]
		n++
	}
	if n == 0 {
		return x.weights[0]
	}
	return s / float64(n)
}

// register (re)creates the state of a request from its tokens.
func (x *ManagerBacked) register(id string, tokens []config.Token) *reqState {
	r := x.reqs[id]
	if r == nil {
		r = &reqState{id: id}
		x.reqs[id] = r
	} else {
		x.unwatch(r)
	}
	r.n = len(tokens)
	if x.scopeOf != nil {
		r.scope = x.scopeOf(id)
	}
	// Every full block may be reused; a trailing partial one is not scored.
	usable := r.n / x.tpb * x.tpb
	var known []blockhash.Key
	if x.known != nil {
		known = x.known(id)
	}
	if nb := usable / x.tpb; len(known) >= nb {
		r.chain = slices.Clone(known[:nb])
	} else {
		r.chain = extendChain(known, r.scope, x.tpb, tokens[:usable])
	}
	r.tokens = nil
	if x.probe {
		r.tokens = slices.Clone(tokens)
	}
	r.prompt, r.scored, r.dirty = true, false, false
	return r
}

func (x *ManagerBacked) watchReq(r *reqState) {
	if r.watched {
		return
	}
	// Events were not tracked while unwatched: the memo may be stale.
	r.watched, r.dirty = true, r.scored
	for _, k := range r.chain {
		x.watch[k] = append(x.watch[k], r)
	}
}

func (x *ManagerBacked) unwatch(r *reqState) {
	if !r.watched {
		return
	}
	r.watched = false
	for _, k := range r.chain {
		list := x.watch[k]
		if i := slices.Index(list, r); i >= 0 {
			list[i] = list[len(list)-1]
			list = list[:len(list)-1]
		}
		if len(list) == 0 {
			delete(x.watch, k)
		} else {
			x.watch[k] = list
		}
	}
}

// cachedPrefix returns how many leading chain blocks are cached and their
// summed weight.
func (x *ManagerBacked) cachedPrefix(r *reqState) (int, float64) {
	limit := len(r.chain)
	if x.probe && r.tokens != nil {
		limit = min(limit, x.m.ProbeReuse(r.scope, r.tokens)/x.tpb)
	}
	for i := 0; i < limit; i++ {
		if x.blocks[r.chain[i]] == nil {
			limit = i
			break
		}
	}
	// The manager trims its backoff off the match's tail.
	limit = max(limit*x.tpb-x.backoff, 0) / x.tpb
	var w float64
	for _, k := range r.chain[:limit] {
		w += x.weight(x.blocks[k])
	}
	return limit, w
}

func (x *ManagerBacked) compute(r *reqState) float64 {
	if !r.scored || r.dirty || !r.watched {
		x.scores++
		_, w := x.cachedPrefix(r)
		r.score = 0
		if r.n > 0 {
			r.score = ClampScore(w * float64(x.tpb) / float64(r.n))
		}
		r.scored, r.dirty = true, false
	}
	return r.score
}

// PredictPrefixReuse returns the level-weighted fraction of tokens whose KV
// is cached now (see ManagerBacked). The first call for a request id
// registers its tokens (copied); later calls with the same number of tokens
// are taken to name the same prompt and are answered from the memo until an
// event touches the request's blocks. A different length re-registers.
func (x *ManagerBacked) PredictPrefixReuse(requestID string, tokens []config.Token) float64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m == nil {
		return 0
	}
	x.drain()
	r := x.reqs[requestID]
	if r == nil || !r.prompt || r.n != len(tokens) {
		r = x.register(requestID, tokens)
	}
	x.watchReq(r)
	return x.compute(r)
}

// ReleaseScore stops watching the request's blocks for score changes; its
// registration stays for GetCPCachedBlocks until NotifyBlocksFreed.
func (x *ManagerBacked) ReleaseScore(requestID string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r := x.reqs[requestID]; r != nil {
		x.unwatch(r)
	}
}

// GetCPCachedBlocks returns the cached prefix of the request's registered
// prompt blocks, then the blocks notified allocated to it that are still
// cached, each key once. Unknown requests get nil.
func (x *ManagerBacked) GetCPCachedBlocks(requestID string) []blockhash.Key {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.drain()
	r := x.reqs[requestID]
	if r == nil {
		return nil
	}
	n, _ := x.cachedPrefix(r)
	out := slices.Clone(r.chain[:n])
	seen := make(map[blockhash.Key]struct{}, len(out))
	for _, k := range out {
		seen[k] = struct{}{}
	}
	for _, k := range r.alloc {
		if _, dup := seen[k]; dup {
			continue
		}
		if x.blocks[k] != nil {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	return out
}

// NotifyBlocksAllocated records that the request holds the blocks. Whether a
// block is cached is decided by the manager's events alone.
func (x *ManagerBacked) NotifyBlocksAllocated(requestID string, keys []blockhash.Key) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.reqs[requestID]
	if r == nil {
		r = &reqState{id: requestID}
		x.reqs[requestID] = r
	}
	if r.allocd == nil {
		r.allocd = map[blockhash.Key]struct{}{}
	}
	for _, k := range keys {
		if _, dup := r.allocd[k]; !dup {
			r.allocd[k] = struct{}{}
			r.alloc = append(r.alloc, k)
		}
	}
}

// NotifyBlocksFreed forgets the request. The blocks stay in the index for as
// long as the manager keeps them cached: they outlive their request.
func (x *ManagerBacked) NotifyBlocksFreed(requestID string, _ []blockhash.Key) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r := x.reqs[requestID]; r != nil {
		x.unwatch(r)
		delete(x.reqs, requestID)
	}
}

// GetAllocationPriority orders the ids by score, highest first, ties in input
// order. Ids never scored rank as 0.
func (x *ManagerBacked) GetAllocationPriority(requestIDs []string) []string {
	if requestIDs == nil {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.drain()
	type item struct {
		id    string
		score float64
	}
	items := make([]item, len(requestIDs))
	for i, id := range requestIDs {
		items[i].id = id
		if r := x.reqs[id]; r != nil && r.prompt {
			items[i].score = x.compute(r)
		}
	}
	slices.SortStableFunc(items, func(a, b item) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.id
	}
	return out
}

// extendChain returns the chain keys of tokens' full blocks, taking the
// first len(known) from known and hashing the rest.
func extendChain(known []blockhash.Key, scope blockhash.Scope, tpb int, tokens []config.Token) []blockhash.Key {
	n := len(tokens) / tpb
	out := make([]blockhash.Key, 0, n)
	out = append(out, known[:min(len(known), n)]...)
	k := scope.Root()
	if len(out) > 0 {
		k = out[len(out)-1]
	}
	h := blockhash.NewHasher()
	for b := len(out); b < n; b++ {
		k = h.Next(k, tokens[b*tpb:(b+1)*tpb])
		out = append(out, k)
	}
	return out
}
