package abimodel

import (
	"math"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/cp"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// CacheOptions are core.CacheOptions with what the C ABI adds.
type CacheOptions struct {
	core.CacheOptions
	// RequestID, when not empty and a CP index is attached, makes the cache
	// notify that index of the blocks it holds (cp.TrackedCache).
	RequestID string
	// OnOpen, if set, runs once the cache exists, before CreateCache
	// returns and before any Close can close it (the C ABI issues the
	// cache's handle there), under the manager's lock: it must not call the
	// manager.
	OnOpen func(*Cache)
	// OnClose, if set, runs once the cache is closed, by Cache.Close or by
	// Manager.Close (the C ABI frees the cache's handle there), after
	// OnOpen.
	OnClose func()
}

// Cache is a kvcm_kv_cache: a core.KVCache, tracked for the CP index that
// was attached when it was created. Its methods are safe for concurrent use.
type Cache struct {
	mgr     *Manager
	c       *core.KVCache
	tc      *cp.TrackedCache // non-nil when a CP index is notified
	cpRef   *CPIndex         // the index tc notifies
	onClose func()
	claimed bool // under mgr.mu: a Close (the cache's or the manager's) took it
}

// CreateCache creates a SUSPENDED cache holding the longest reusable prefix
// of the input tokens. With a request id and an attached CP index, the
// index is notified of the reused blocks (outside the manager's locks: it
// may be foreign code) and of every block the cache later commits or frees.
func (mgr *Manager) CreateCache(opts CacheOptions) (*Cache, error) {
	mgr.mu.Lock()
	if mgr.gone {
		mgr.mu.Unlock()
		return nil, destroyedErr("manager is being destroyed")
	}
	if mgr.attached != nil && opts.RequestID != "" && len(opts.InputDigests) > 0 {
		mgr.mu.Unlock()
		return nil, errDigestsTracked("options.input_digest_positions")
	}
	c, err := mgr.m.CreateKVCache(opts.CacheOptions)
	if err != nil {
		mgr.mu.Unlock()
		return nil, err
	}
	obj := &Cache{mgr: mgr, c: c, onClose: opts.OnClose}
	var added []blockhash.Key
	if idx := mgr.attached; idx != nil && opts.RequestID != "" {
		idx.acquire()
		obj.tc, added = cp.NewTracker(mgr.m, idx.index).Wrap(opts.RequestID, c, opts.CacheOptions)
		obj.cpRef = idx
	}
	if opts.OnOpen != nil {
		opts.OnOpen(obj)
	}
	mgr.caches[obj] = struct{}{}
	mgr.mu.Unlock()
	if len(added) > 0 {
		obj.cpRef.index.NotifyBlocksAllocated(opts.RequestID, added)
	}
	return obj, nil
}

// Core returns the core cache, for queries.
func (c *Cache) Core() *core.KVCache { return c.c }

// Close closes the cache (see core.KVCache.Close); a tracked cache then
// notifies the terminal free of its blocks and lets go of its CP index, and
// OnClose runs. Only the first Close (of the cache or of its manager) does
// anything: later ones return nil, as closing a core cache twice does.
func (c *Cache) Close() error {
	mgr := c.mgr
	mgr.mu.Lock()
	if c.claimed {
		mgr.mu.Unlock()
		return nil
	}
	c.claimed = true
	delete(mgr.caches, c)
	mgr.closing.Add(1)
	mgr.mu.Unlock()
	defer mgr.closing.Done()
	return c.close()
}

// close runs once, by the Close that claimed the cache.
func (c *Cache) close() error {
	var err error
	if c.tc == nil {
		err = c.c.Close()
	} else {
		err = c.tc.Close()
		c.cpRef.release()
	}
	if c.onClose != nil {
		c.onClose()
	}
	return err
}

// Resume makes a SUSPENDED cache ACTIVE on s (see core.KVCache.Resume), a
// live stream of the manager's device. A stream DestroyStream is destroying
// is refused, and DestroyStream refuses a stream while a Resume on it is in
// flight.
func (c *Cache) Resume(s device.Stream) error {
	if s == nil {
		return argErr("stream", "must not be nil")
	}
	mgr, h := c.mgr, s.Handle()
	mgr.smu.Lock()
	if mgr.retiring[h] {
		mgr.smu.Unlock()
		return argErr("stream", "%#x is being destroyed", h)
	}
	if _, err := mgr.Stream(h); err != nil {
		mgr.smu.Unlock()
		return err
	}
	mgr.resuming[h]++
	mgr.smu.Unlock()
	defer func() {
		mgr.smu.Lock()
		if mgr.resuming[h]--; mgr.resuming[h] == 0 {
			delete(mgr.resuming, h)
		}
		mgr.smu.Unlock()
	}()
	return c.c.Resume(s)
}

// SetStream moves the cache to s (see core.KVCache.SetStream), a live
// stream of the manager's device; one DestroyStream is destroying is
// refused.
func (c *Cache) SetStream(s device.Stream) error {
	mgr, h := c.mgr, s.Handle()
	mgr.smu.Lock()
	defer mgr.smu.Unlock()
	if mgr.retiring[h] {
		return argErr("stream", "%#x is being destroyed", h)
	}
	return c.c.SetStream(s)
}

// Suspend makes an ACTIVE cache SUSPENDED (see core.KVCache.Suspend).
func (c *Cache) Suspend() error { return c.c.Suspend() }

// Resize sets the capacity and history length of an ACTIVE cache (see
// core.KVCache.Resize); a negative history keeps it. Both are bounded by
// MaxElems.
func (c *Cache) Resize(capacity, history int64) error {
	if capacity < 0 || capacity > MaxElems {
		return argErr("capacity", "must be in [0, 2^40], got %d", capacity)
	}
	if history > MaxElems {
		return argErr("history_length", "%d is too large", history)
	}
	h := int(history)
	if history < 0 {
		h = -1
	}
	return c.c.Resize(int(capacity), h)
}

// Commit commits computed tokens (see core.KVCache.Commit); a tracked cache
// notifies its CP index of the blocks they complete.
func (c *Cache) Commit(tokens []config.Token, isEnd bool) error {
	if c.tc != nil {
		return c.tc.Commit(tokens, isEnd)
	}
	return c.c.Commit(tokens, isEnd)
}

// DecodeSteps applies one-token decode steps (see
// core.KVCache.DecodeSteps); a tracked cache notifies its CP index of the
// blocks they complete.
func (c *Cache) DecodeSteps(tokens []config.Token) error {
	if c.tc != nil {
		return c.tc.DecodeSteps(tokens)
	}
	return c.c.DecodeSteps(tokens)
}

// CommitBeamSearch commits tokens after a beam search step (see
// core.KVCache.CommitBeamSearch); a tracked cache notifies its CP index.
func (c *Cache) CommitBeamSearch(tokens []config.Token, beamSearchIndices []int, isEnd bool) error {
	if c.tc != nil {
		return c.tc.CommitBeamSearch(tokens, beamSearchIndices, isEnd)
	}
	return c.c.CommitBeamSearch(tokens, beamSearchIndices, isEnd)
}

// CommitDigests commits computed tokens with digest tokens (see
// core.KVCache.CommitDigests). A cache its CP index tracks takes text only:
// the index names blocks by text keys.
func (c *Cache) CommitDigests(tokens []config.Token, digests []blockhash.DigestAt, isEnd bool) error {
	if len(digests) == 0 {
		return c.Commit(tokens, isEnd)
	}
	if c.tc != nil {
		return errDigestsTracked("digest_positions")
	}
	return c.c.CommitDigests(tokens, digests, isEnd)
}

func errDigestsTracked(arg string) error {
	return argErr(arg, "digest tokens in a cache its CP index tracks (the CP index keys text tokens only)")
}

// StopCommitting refuses further commits (see core.KVCache.StopCommitting).
func (c *Cache) StopCommitting() { c.c.StopCommitting() }

// Prefetch brings the cache's pages up to level (see core.KVCache.Prefetch).
func (c *Cache) Prefetch(level layout.CacheLevel) error { return c.c.Prefetch(level) }

// Manager returns the cache's manager.
func (c *Cache) Manager() *Manager { return c.mgr }

// Digests pairs a sequence's digest token positions with their
// blockhash.DigestSize bytes each, as the ABI passes them (positions and
// one byte string); a byte count that does not match is an invalid
// argument naming name. No positions are nil.
func Digests(positions []uint64, bytes, name string) ([]blockhash.DigestAt, error) {
	if uint64(len(bytes)) != uint64(len(positions))*blockhash.DigestSize {
		return nil, argErr(name, "%d digests need %d digest bytes, got %d", len(positions), uint64(len(positions))*blockhash.DigestSize, len(bytes))
	}
	if len(positions) == 0 {
		return nil, nil
	}
	out := make([]blockhash.DigestAt, len(positions))
	for i, p := range positions {
		out[i].Pos = int(min(p, uint64(math.MaxInt)))
		copy(out[i].Digest[:], bytes[i*blockhash.DigestSize:])
	}
	return out, nil
}

// KVCacheOptions are a cache's options as the ABI carries them
// (kvcm_kv_cache_options): CacheOptions, and what the ABI holds in a form
// of its own. Resolve turns them into CreateCache's options. Its
// ExpectedPromptLength shadows core.CacheOptions' (a *int there, a flag and
// a value here).
type KVCacheOptions struct {
	CacheOptions
	// ScopeHasLoraID makes Scope.LoRAID an adapter id, 0 included.
	ScopeHasLoraID bool
	// HasExpectedPromptLength says ExpectedPromptLength is set.
	HasExpectedPromptLength bool
	ExpectedPromptLength    int
	// InputDigestPositions and InputDigestBytes are the input's digest
	// tokens (Digests pairs them).
	InputDigestPositions []uint64
	InputDigestBytes     string
	// BlockPriority and LayerGroupPriority are the user's priority
	// callbacks (kvcm_priority_func, kvcm_layer_group_priority_func), at
	// most one of them; Resolve makes the one given CacheOptions.Priority.
	BlockPriority      BlockPriorityFunc
	LayerGroupPriority LayerGroupPriorityFunc
}

// BlockPriorityFunc is a user's priority callback of a block; an error is
// its failure.
type BlockPriorityFunc func(block int64) (int32, error)

// LayerGroupPriorityFunc is a user's priority callback of a block's page in
// a layer group; an error is its failure.
type LayerGroupPriorityFunc func(block int64, lg layout.LayerGroupID) (int32, error)

// userPriority is the core's PriorityFunc over a user's callback: a failure
// panics, and the core fails the resize or commit that asked, changing
// nothing.
func userPriority(fn LayerGroupPriorityFunc) core.PriorityFunc {
	return func(block int, lg layout.LayerGroupID) int {
		pr, err := fn(int64(block), lg)
		if err != nil {
			panic(err)
		}
		return int(pr)
	}
}

// Resolve returns the options CreateCache takes; it changes nothing in o.
// Errors name the kvcm_kv_cache_options field.
func (o KVCacheOptions) Resolve() (CacheOptions, error) {
	co := o.CacheOptions
	co.Scope.HasLoRA = o.ScopeHasLoraID
	if o.HasExpectedPromptLength {
		n := o.ExpectedPromptLength
		co.CacheOptions.ExpectedPromptLength = &n
	}
	ds, err := Digests(o.InputDigestPositions, o.InputDigestBytes, "options.input_digest_positions")
	if err != nil {
		return co, err
	}
	co.InputDigests = ds
	switch block := o.BlockPriority; {
	case o.LayerGroupPriority != nil && block != nil:
		return co, argErr("options.layer_group_priority", "is set together with options.priority; set one of them")
	case o.LayerGroupPriority != nil:
		co.Priority = userPriority(o.LayerGroupPriority)
	case block != nil:
		co.Priority = userPriority(func(b int64, _ layout.LayerGroupID) (int32, error) { return block(b) })
	}
	return co, nil
}
