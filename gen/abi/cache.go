package abi

import "github.com/kvcm/kvcm/gen/spec"

// ReuseScope separates reuse: blocks are shared only within one scope (a
// LoRA adapter id and an optional salt, for example a tenant). Its lora_id 0
// means no adapter; the functions and options of ABI version 2 take a
// has_lora_id flag beside it that makes 0 an adapter id too
// (KVCacheManagerV2's ReuseScope(lora_id=0), a scope other than
// ReuseScope(lora_id=None)).
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/blockhash.Scope
//kvcm:cppvalue ReuseScope order=loraId,salt
//kvcm:cppdoc The reuse scope: blocks are shared only within one scope. As in
//kvcm:cppdoc KVCacheManagerV2's ReuseScope, no LoRA adapter (nullopt) and adapter 0 are
//kvcm:cppdoc different scopes.
//kvcm:cppfield loraId std::optional<std::int64_t> | The LoRA adapter id, nullopt for none (lora_id and the has_lora_id flag beside the scope).
type ReuseScope struct {
	// LoraID is the LoRA adapter id (0 for none, unless a has_lora_id flag
	// beside the scope is set).
	LoraID int64 `go:"LoRAID" cpp:"-"`
	// Salt is salt_len bytes (NULL when salt_len is 0); it may contain NULs.
	Salt spec.CStr `len:"SaltLen" nullable:"true" own:"borrowed"`
	// SaltLen is the length of salt in bytes.
	SaltLen spec.Size
}

// KVCacheOptions configures kvcm_kv_cache_create. Zero-initialize it and set
// struct_size = sizeof(kvcm_kv_cache_options) and abi_version =
// KVCM_ABI_VERSION.
//
//kvcm:struct
//kvcm:versioned
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/abimodel.KVCacheOptions
type KVCacheOptions struct {
	// Scope is the reuse scope.
	Scope ReuseScope
	// InputTokens is the prompt; the longest cached prefix of it is reused,
	// all of it when all of it is cached (less the configuration's
	// reuse_match_backoff): an engine that must compute the last prompt
	// token leaves it out.
	InputTokens spec.In[Token] `len:"NumInputTokens" nullable:"true" own:"borrowed"`
	// NumInputTokens is the length of input_tokens.
	NumInputTokens spec.Size
	// Priority, when not NULL, gives the cache's pages their eviction
	// priority as they are allocated (see kvcm_priority_func). It is called
	// with the manager's lock held.
	Priority PriorityFunc `nullable:"true" go:"BlockPriority" user:"PriorityUserData"`
	// PriorityUserData is passed to priority; the library never
	// dereferences it. It must stay valid until the cache is closed.
	PriorityUserData spec.VoidPtr `nullable:"true" own:"borrowed" go:"-"`
	// RequestID names the request the cache serves, for the CP index
	// attached to the manager (kvcm_manager_attach_cp): request_id_len bytes,
	// not NUL-terminated. A cache without one (length 0) notifies nothing.
	RequestID spec.CStr `len:"RequestIDLen" nullable:"true" own:"borrowed"`
	// RequestIDLen is the length of request_id in bytes.
	RequestIDLen spec.Size
	// ScopeHasLoraID marks scope.lora_id as a LoRA adapter id, 0 included.
	ScopeHasLoraID bool `since:"2"`
	// LayerGroupPriority, when not NULL, gives the cache's pages their
	// eviction priority per layer group as they are allocated (priority must
	// be NULL then). It is called with priority_user_data and the manager's
	// lock held.
	LayerGroupPriority LayerGroupPriorityFunc `nullable:"true" since:"2" user:"PriorityUserData"`
	// HasExpectedPromptLength makes expected_prompt_length the cache's
	// prefill/generation boundary of the statistics; unset, the boundary is
	// num_input_tokens, and without input tokens no growth counts as
	// generation.
	HasExpectedPromptLength bool `since:"2"`
	// ExpectedPromptLength (KVCacheManagerV2's expected_prompt_length, not
	// negative): once the cache's history has reached it, capacity growth
	// counts as generation-phase allocation (gen_alloc_blocks of
	// kvcm_manager_get_and_reset_layer_group_iteration_stats). It changes no
	// allocation or reuse.
	ExpectedPromptLength int64 `since:"2"`
	// InputDigestPositions are the positions of input_tokens' multimodal
	// digest tokens (ascending, each once; the tokens' values there are
	// ignored), or NULL for none: see kvcm_block_keys.
	InputDigestPositions spec.In[spec.Size] `len:"NumInputDigests" nullable:"true" own:"borrowed" since:"2"`
	// NumInputDigests is the length of input_digest_positions.
	NumInputDigests spec.Size `since:"2"`
	// InputDigestBytes are the digests, 32 bytes each in the order of
	// input_digest_positions.
	InputDigestBytes spec.CStr `len:"InputDigestBytesLen" nullable:"true" own:"borrowed" since:"2"`
	// InputDigestBytesLen is 32 * num_input_digests.
	InputDigestBytesLen spec.Size `since:"2"`
	// TextOnly refuses digest tokens for this cache, at creation and in
	// commits (KVCacheManagerV2's text_only); the manager's text_only does
	// so for every cache.
	TextOnly bool `since:"2"`
	// FreshBlocks, when positive, is a reuse plan that leaves a run of the
	// cached prefix to the engine (a fresh run): the cache reuses the
	// matched prefix but its fresh_blocks blocks from block
	// fresh_from_block on, which get fresh GPU pages for the engine to
	// compute while the reused blocks after them come up from colder
	// levels. The history length and reused tokens are the whole matched
	// prefix; the committed tokens end at the run's start until the engine
	// commits the run's tokens (nothing else), and the commit completing it
	// jumps to the matched prefix's end. A run the GPU has no room for
	// leaves the whole prefix reused; one reaching the match's end is a cut
	// there. Not with SSM layers, sliding windows or digests
	// (KVCM_ERR_INVALID_ARGUMENT, as are negative counts and
	// fresh_from_block without fresh_blocks; the message names the field).
	// kvcm_kv_cache_get_fresh_range says what the cache got.
	FreshBlocks int64 `since:"2"`
	// FreshFromBlock is the fresh run's first block (0: the prompt's
	// first); set only with fresh_blocks.
	FreshFromBlock int64 `since:"2"`
}

// KVCacheCreate creates a SUSPENDED KV cache holding the longest reusable
// cached prefix of the input tokens: full blocks are shared; with partial
// reuse, the matching head of one more block is copied into a private page.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:param manager in The manager.
//kvcm:param options borrowed The cache options; read during the call only (priority_user_data excepted).
//kvcm:param out out Receives the cache handle (0 on failure).
type KVCacheCreate func(manager Manager, options spec.In[KVCacheOptions], out spec.Out[KVCache]) *Status

// KVCacheClose releases every page of the cache and frees its handle:
// committed blocks stay cached for reuse until evicted, private pages are
// freed. The handle is consumed even when an error is reported. The engine
// need not synchronize first: closing an ACTIVE cache records an event on its
// stream, and whoever uses its pages next (a migration, another cache) waits
// for the work enqueued there so far. Work on other streams is not covered:
// make the cache's stream wait for it, or synchronize it, before closing, and
// enqueue nothing touching the pages afterwards.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:param cache consumed The cache to close.
type KVCacheClose func(cache KVCache) *Status

// KVCacheResume makes a SUSPENDED cache ACTIVE on a stream: pages on colder
// levels are brought back to the GPU (decoded), every page is pinned there,
// and the stream waits until they are ready (for a cache whose fresh run is
// owed, but the tail's: see kvcm_kv_cache_wait_fresh_tail). Fails with
// KVCM_ERR_RESUME_REFUSED while the GPU level is busier than
// max_util_for_resume, KVCM_ERR_OUT_OF_PAGES when the GPU cannot take the
// pages back, KVCM_ERR_CODEC_FAILED when the codec failed to decode some (they
// are dropped) and KVCM_ERR_DATA_LOST when a failure destroyed one of them
// (close the cache then). On error the cache stays SUSPENDED. A failure of the
// asynchronous decode that is not known when resume returns reaches the
// stream and, once known, fails the cache's next call with
// KVCM_ERR_DATA_LOST. The stream must stay valid until the cache is suspended
// or closed.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call ResumeOn
//kvcm:param cache in The cache.
//kvcm:param stream in The engine's stream on the manager's device: one kvcm_manager_create_stream made or, since ABI version 2, any the engine owns (on CUDA a CUstream of the device's context, 0 the legacy default stream included; on the emulated device any value names an emulated stream of its own, made on first use).
type KVCacheResume func(cache KVCache, stream Stream) *Status

// KVCacheSetStream moves the cache to a stream, as setting
// KVCacheManagerV2's cuda_stream does: an ACTIVE cache's work continues on
// the new stream, which first waits (an event orders them) for everything
// enqueued on the old one so far; on a SUSPENDED cache it only records the
// stream (Go's KVCache.Resume(nil) resumes there). The stream, one the manager created or
// one the engine owns (as for kvcm_kv_cache_resume), must stay valid while the
// cache uses it.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call SetStreamOf
//kvcm:param cache in The cache.
//kvcm:param stream in The engine's stream on the manager's device.
type KVCacheSetStream func(cache KVCache, stream Stream) *Status

// KVCacheSuspend makes an ACTIVE cache SUSPENDED. Its pages stay reachable;
// with colder levels they may be evicted there and come back on resume. As
// for kvcm_kv_cache_close, the engine need not synchronize first: suspend
// records an event on the cache's stream that every later move of its pages
// waits for, so all work touching them must be enqueued on that stream (or
// made to precede it) before the call, and none after it.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Suspend
//kvcm:param cache in The cache.
type KVCacheSuspend func(cache KVCache) *Status

// KVCacheResize sets the capacity (tokens with pages) and the history length
// (tokens whose KV is computed) of an ACTIVE cache. New pages come from the
// GPU level, evicting if needed; pages a sliding window no longer needs are
// released. The cache's priority function is asked about each new page
// first. On error (a priority function that reports failure included:
// KVCM_ERR_INVALID_ARGUMENT) nothing changes.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Resize
//kvcm:param cache in The cache.
//kvcm:param capacity in The new capacity in tokens.
//kvcm:param historyLength in The new history length in tokens; negative keeps it.
type KVCacheResize func(cache KVCache, capacity int64, historyLength int64) *Status

// KVCacheCommit appends computed tokens to the committed sequence; every
// block they complete is published for reuse. Committed tokens are history:
// when they pass the history length it advances to them (releasing pages a
// sliding window no longer needs, after publishing them), so they must fit in
// the capacity (KVCM_ERR_INVALID_ARGUMENT otherwise). With is_end no further
// commits are accepted (see kvcm_kv_cache_stop_committing). It first waits for any decode still bringing those blocks'
// pages back, so that a page lost to its failure is never published (the
// call fails with KVCM_ERR_DATA_LOST instead). On error (a priority function
// that reports failure included: KVCM_ERR_INVALID_ARGUMENT) nothing changes.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Commit
//kvcm:param cache in The cache.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,short,go=github.com/kvcm/kvcm/core/config.Token The tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param isEnd in Whether these are the last tokens to commit.
type KVCacheCommit func(cache KVCache, tokens spec.In[Token], numTokens spec.Size, isEnd bool) *Status

// KVCacheDecodeSteps applies num_tokens one-token decode steps to an ACTIVE
// cache in one call: for each token t in order, exactly what
// kvcm_kv_cache_resize(cache, max(capacity, history_length + 1),
// history_length + 1) followed by kvcm_kv_cache_commit(cache, &t, 1, false)
// do, with every side effect of those calls (the demand sample of each
// resize, statistics, block events, the blocks t fills published, pages a
// sliding window no longer needs released, the priority function asked).
// Before any step applies it checks the cache's state (ACTIVE, commits not
// stopped, the history length at the committed tokens, one beam, no SWA
// scratch reuse, no fresh run's commit owed: KVCM_ERR_INVALID_STATE), the
// priority function's answers (asked then, in the steps' order:
// KVCM_ERR_INVALID_ARGUMENT when it reports failure) and the GPU pages of
// every block the run adds (reserved at once: KVCM_ERR_OUT_OF_PAGES); on
// those errors nothing changes. Only a device failure recording the event of
// a block the run publishes fails the call after the steps before that
// block applied; its message says how many.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call DecodeSteps
//kvcm:param cache in The cache.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,short,go=github.com/kvcm/kvcm/core/config.Token The tokens, one a step (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens (of steps; 0 does nothing).
type KVCacheDecodeSteps func(cache KVCache, tokens spec.In[Token], numTokens spec.Size) *Status

// KVCacheStopCommitting refuses further commits; tokens computed from now on
// (for example generated ones) are never published. With partial reuse the
// trailing partial block of the committed tokens is published: at once by
// an ACTIVE cache of one beam without SSM layers (as KVCacheManagerV2
// commits it when commits stop), else at close.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call StopCommitting
//kvcm:param cache in The cache.
type KVCacheStopCommitting func(cache KVCache) *Status

// KVCachePrefetch moves the pages of a SUSPENDED cache that are on levels
// colder than level up to level, without pinning them.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Prefetch
//kvcm:param cache in The cache.
//kvcm:param level in The level to bring pages up to.
type KVCachePrefetch func(cache KVCache, level CacheLevel) *Status

// KVCacheGetStatus returns the cache's status.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().Status
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the status.
type KVCacheGetStatus func(cache KVCache, out spec.Out[CacheStatus]) *Status

// KVCacheGetID returns the cache's id, unique within its manager.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().ID
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the id.
type KVCacheGetID func(cache KVCache, out spec.Out[uint64]) *Status

// KVCacheGetNumCommittedTokens returns how many tokens are committed.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().NumCommittedTokens
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the count.
type KVCacheGetNumCommittedTokens func(cache KVCache, out spec.Out[int64]) *Status

// KVCacheGetHistoryLength returns how many tokens have their KV computed.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().HistoryLength
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the count.
type KVCacheGetHistoryLength func(cache KVCache, out spec.Out[int64]) *Status

// KVCacheGetCapacity returns how many tokens the cache holds pages for.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().Capacity
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the count.
type KVCacheGetCapacity func(cache KVCache, out spec.Out[int64]) *Status

// KVCacheGetCommittedTokens writes the committed tokens.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().CommittedTokens
//kvcm:param cache in The cache.
//kvcm:param tokens out,nullable,len=capacity,buffer=needed,go=github.com/kvcm/kvcm/core/config.Token Receives the committed tokens.
//kvcm:param capacity in Capacity of tokens, in elements.
//kvcm:param needed out Receives the number of committed tokens.
type KVCacheGetCommittedTokens func(cache KVCache, tokens spec.Out[Token], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// KVCacheGetReusedTokens returns how many tokens were reused at creation.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().ReusedTokens
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the count.
type KVCacheGetReusedTokens func(cache KVCache, out spec.Out[int64]) *Status

// KVCacheGetFreshRange returns the tokens [from, to) of the fresh run the
// cache was created with (kvcm_kv_cache_options.fresh_blocks): from == to
// for none.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().FreshRange
//kvcm:param cache in The cache.
//kvcm:param from out,result Receives the run's first token.
//kvcm:param to out,result Receives the token after the run's last.
type KVCacheGetFreshRange func(cache KVCache, from spec.Out[int64], to spec.Out[int64]) *Status

// KVCacheWaitFreshTail makes a stream wait until the tail of the cache's
// fresh run is ready. While the run is owed (not yet committed),
// kvcm_kv_cache_resume makes the cache's stream wait only for the pages the
// run's compute reads and writes, so the run's prefill overlaps the
// onboarding of the blocks after it (the tail); the engine calls this
// before any work that reads past the run (resume, compute the run, commit
// it, wait for the tail, attend past the run). Idempotent: once it has run
// on the cache's stream, later calls do nothing until the next resume, as
// does a call for a cache without a run or whose resume waited for the tail
// (after the run's commit); on another stream it orders that stream only.
// A failed onboarding of the tail reaches the stream. The library's own
// work on the tail (its migrations, another cache's resume) waits for the
// onboarding without it. Fails with KVCM_ERR_INVALID_STATE unless the cache
// is ACTIVE.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call WaitFreshTailOn
//kvcm:param cache in The cache.
//kvcm:param stream in The stream that will read past the run, usually the cache's (as for kvcm_kv_cache_resume).
type KVCacheWaitFreshTail func(cache KVCache, stream Stream) *Status

// KVCacheGetBasePageIndices writes, for an ACTIVE cache, the GPU slot of each
// block in a layer group (KVCM_BAD_PAGE_INDEX where the block has no page).
// Turn a base index b into a buffer's page index with b*scale + offset from
// kvcm_manager_get_buffer_location.
//
//kvcm:since 1
//kvcm:thread manager
//kvcm:call Core().BasePageIndices
//kvcm:param cache in The cache.
//kvcm:param layerGroup in The layer group.
//kvcm:param indices out,nullable,len=capacity,buffer=needed,go=int32 Receives one index per block.
//kvcm:param capacity in Capacity of indices, in elements.
//kvcm:param needed out Receives the number of blocks.
type KVCacheGetBasePageIndices func(cache KVCache, layerGroup LayerGroupID, indices spec.Out[int32], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// KVCacheGetBeamWidth returns the cache's beam width: how many beams have
// page indices (1 at creation).
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().BeamWidth
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the beam width.
type KVCacheGetBeamWidth func(cache KVCache, out spec.Out[int32]) *Status

// KVCacheSetBeamWidth sets the number of beams of an ACTIVE cache, in
// [1, KVCM_MAX_BEAM_WIDTH]. New beams fork from beam 0: they share its pages,
// except that each gets a copy (on the cache's stream) of every block holding
// a position at or past the history length, the diverging block beams write
// into next; new blocks get a page per beam. Beams at or beyond a smaller
// width are dropped with their private pages. KVCM_ERR_OUT_OF_PAGES when the
// GPU level has no room for the copies; on error nothing changes.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().SetBeamWidth
//kvcm:param cache in The cache.
//kvcm:param beamWidth in The new beam width.
type KVCacheSetBeamWidth func(cache KVCache, beamWidth int32) *Status

// KVCacheGetBeamBasePageIndices is kvcm_kv_cache_get_base_page_indices for
// one beam, in [0, beam width) (kvcm_kv_cache_get_base_page_indices reads
// KVCM_DEFAULT_BEAM_INDEX). Beams read the same index where they share a
// page.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().BasePageIndicesOfBeam
//kvcm:param cache in The cache.
//kvcm:param layerGroup in The layer group.
//kvcm:param beam in The beam.
//kvcm:param indices out,nullable,len=capacity,buffer=needed,go=int32 Receives one index per block.
//kvcm:param capacity in Capacity of indices, in elements.
//kvcm:param needed out Receives the number of blocks.
type KVCacheGetBeamBasePageIndices func(cache KVCache, layerGroup LayerGroupID, beam int32, indices spec.Out[int32], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// KVCacheCommitBeamSearch is kvcm_kv_cache_commit after a beam search step:
// first beam j takes over the history of beam beam_search_indices[j] (one
// entry per beam; beams reordered, forked or dropped; a page two beams would
// share in the diverging block is copied for the later one, on the cache's
// stream), then the tokens, converged and in beam 0, are committed. A block
// they complete is published once, from beam 0, and every beam reads beam
// 0's page of it from then on. NULL beam_search_indices keeps the beams. On
// error nothing changes.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call CommitBeamSearch
//kvcm:param cache in The cache.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param beamSearchIndices borrowed,nullable,len=numBeamSearchIndices,slice,go=int,nullnil The old beam of each beam, or NULL.
//kvcm:param numBeamSearchIndices in The number of entries of beam_search_indices: the beam width.
//kvcm:param isEnd in Whether these are the last tokens to commit.
type KVCacheCommitBeamSearch func(cache KVCache, tokens spec.In[Token], numTokens spec.Size, beamSearchIndices spec.In[int32], numBeamSearchIndices spec.Size, isEnd bool) *Status

// KVCacheGetStats returns the block counters the cache added to the
// manager's since its creation: reused and missed blocks at creation and the
// blocks resize allocated for it (evictions and lost_pages are the manager's
// and stay 0 here).
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().Stats
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the counters.
type KVCacheGetStats func(cache KVCache, out spec.Out[BlockStats]) *Status

// KVCacheCommitPendingStats adds the cache's pending per-layer-group counts
// (its reuse and partial copy at creation, the pages resize allocated for it
// since; kvcm_kv_cache_get_pending_stats sums them) to the manager's
// iteration statistics
// (kvcm_manager_get_and_reset_layer_group_iteration_stats) and clears them,
// as KVCacheManagerV2's commit_pending_stats. Page movements are not pending:
// they count when they happen. kvcm_kv_cache_close drops what is pending.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().CommitPendingStats
//kvcm:param cache in The cache.
type KVCacheCommitPendingStats func(cache KVCache) *Status

// KVCacheGetPendingStats returns the cache's pending counts (those
// kvcm_kv_cache_commit_pending_stats would commit now) as KVCacheManagerV2's
// per-request statistics: all zero after a commit or discard.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().PendingRequestStats
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the counts.
type KVCacheGetPendingStats func(cache KVCache, out spec.Out[KVCacheStatsDelta]) *Status

// KVCacheDiscardPendingStats drops the cache's pending per-layer-group counts:
// they never reach the manager's iteration statistics.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().DiscardPendingStats
//kvcm:param cache in The cache.
type KVCacheDiscardPendingStats func(cache KVCache) *Status

// KVCacheGetCachedTokensByLevel returns, per cache level, how many of the
// cache's tokens with computed KV (its history) are held on that level: a
// block's tokens at the coldest level of its pages; a block whose pages a
// sliding window released counts nowhere.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().CachedTokensByLevel
//kvcm:param cache in The cache.
//kvcm:param tokens out,nullable,len=capacity,buffer=needed,go=int Receives one count per level.
//kvcm:param capacity in Capacity of tokens, in elements.
//kvcm:param needed out Receives the number of levels.
type KVCacheGetCachedTokensByLevel func(cache KVCache, tokens spec.Out[int64], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// KVCacheGetScratchDesc returns the scratch blocks of a layer group in the
// ACTIVE cache's current step and its scratch slots (KVCacheManagerV2's
// get_scratch_desc): blocks [begin, end) have no page
// (KVCM_BAD_PAGE_INDEX) and are computed in the slots, ids of the layer
// group's GPU pool group; begin == end when there are none. Turn a scratch
// block into a buffer's page index with
// kvcm_manager_get_scratch_pages_per_block. Valid until the cache's next
// resize, commit, suspend or close.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call ScratchDesc
//kvcm:param cache in The cache.
//kvcm:param layerGroup in The layer group.
//kvcm:param begin out,result Receives the first scratch block.
//kvcm:param end out,result Receives the block after the last scratch block.
//kvcm:param slots out,nullable,len=capacity,buffer=needed,go=int32 Receives the scratch slot ids.
//kvcm:param capacity in Capacity of slots, in elements.
//kvcm:param needed out Receives the number of scratch slots.
type KVCacheGetScratchDesc func(cache KVCache, layerGroup LayerGroupID, begin spec.Out[int64], end spec.Out[int64], slots spec.Out[int32], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// KVCacheHasScratchSlots reports whether the cache holds scratch slots now
// (only an ACTIVE cache in a step with scratch blocks does).
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().HasScratchSlots
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives whether it holds scratch slots.
type KVCacheHasScratchSlots func(cache KVCache, out spec.Out[bool]) *Status

// KVCacheGetSwaScratchReuse reports whether the cache uses scratch slots;
// it starts as the manager's swa_scratch_reuse.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().SwaScratchReuse
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives whether scratch reuse is on.
type KVCacheGetSwaScratchReuse func(cache KVCache, out spec.Out[bool]) *Status

// KVCacheSetSwaScratchReuse turns scratch reuse on or off for the cache:
// on only with the manager's swa_scratch_reuse (KVCM_ERR_INVALID_ARGUMENT),
// and either way only while the current step has no scratch blocks with it
// on (KVCM_ERR_INVALID_STATE), so no page changes.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().SetSwaScratchReuse
//kvcm:param cache in The cache.
//kvcm:param enable in Whether to use scratch slots.
type KVCacheSetSwaScratchReuse func(cache KVCache, enable bool) *Status

// KVCachePlanCommittedBlockDrop plans dropping the committed pages of the
// cache's full committed blocks in the window of every sliding-window layer
// group (past its sinks), which only the next turn of a conversation would
// reuse (KVCacheManagerV2's plan_committed_block_drop). It needs
// kvcm_kv_cache_stop_committing (or an is_end commit) first
// (KVCM_ERR_INVALID_STATE). out is 0, nothing planned, when the cache
// committed no full block or a page is no longer cached; otherwise free it
// with kvcm_planned_drop_destroy.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the plan's handle, or 0.
type KVCachePlanCommittedBlockDrop func(cache KVCache, out spec.Out[PlannedDrop]) *Status

// PlannedDropDrop carries out a plan (PlannedDropHandle.drop): each planned
// page no other plan names is dropped from every level unless a cache uses
// it now. Carrying it out again is KVCM_ERR_INVALID_STATE; after the
// manager's destroy it is KVCM_ERR_CLOSED.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Drop
//kvcm:param drop in The plan.
type PlannedDropDrop func(drop PlannedDrop) *Status

// PlannedDropDestroy frees a plan's handle, carrying the plan out first
// when it was not (as KVCacheManagerV2 does when its handle goes) and its
// manager is alive. The handle is consumed even when an error is reported.
//
//kvcm:since 2
//kvcm:thread handle
//kvcm:param drop consumed The plan.
type PlannedDropDestroy func(drop PlannedDrop) *Status

// KVCacheGetSsmBlockBaseIndex returns, for an ACTIVE cache, the GPU slot of
// its SSM state in a layer group (KVCacheManagerV2's
// get_ssm_block_base_index), KVCM_BAD_PAGE_INDEX for an attention layer
// group. Turn it into a buffer's page index with b*scale + offset from
// kvcm_manager_get_buffer_location. A cache gets its SSM state at its first
// resume: a copy of the snapshot it reused, or a fresh one.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().SsmBlockBaseIndex
//kvcm:param cache in The cache.
//kvcm:param layerGroup in The layer group.
//kvcm:param out out,result Receives the slot.
type KVCacheGetSsmBlockBaseIndex func(cache KVCache, layerGroup LayerGroupID, out spec.Out[int32]) *Status

// ReuseDiagnostics says how a cache's reuse was cut at its creation
// (KVCacheManagerV2's _get_num_reusable_tokens_before_pruning and
// _before_hybrid_pruning), after reuse_match_backoff.
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core.ReuseDiagnostics
type ReuseDiagnostics struct {
	// ContentTokens are the tokens of the prompt's full blocks the tree
	// holds by content.
	ContentTokens int64
	// AttentionTokens are those of them the attention layer groups can
	// reuse (their pages present); with SSM layers the reused tokens are
	// these cut back to the last SSM snapshot.
	AttentionTokens int64
}

// KVCacheGetReuseDiagnostics returns how the cache's reuse was cut at its
// creation.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().ReuseDiagnostics
//kvcm:param cache in The cache.
//kvcm:param out out,result Receives the diagnostics.
type KVCacheGetReuseDiagnostics func(cache KVCache, out spec.Out[ReuseDiagnostics]) *Status
