package abi

import "github.com/kvcm/kvcm/gen/spec"

// Multimodal digest tokens (KVCacheManagerV2's bytes and MmItemContext
// tokens). A token sequence with digests is passed as its tokens plus
// digest_positions (ascending, each once, inside the tokens; the tokens'
// values there are ignored) and digest_bytes (the 32 bytes of each digest
// in the order of the positions: 32 * num_digests bytes). A block's digests
// enter its key; an item's uuid never does.

// BlockKeys computes the block keys of a token sequence in a reuse scope
// (KVCacheManagerV2's sequence_to_blockchain_keys, less its root pair):
// one key per full block of tokens_per_block tokens and, with partial, one
// more for a trailing partial block, chained from the scope's root; the
// keys a manager with that block_key gives the blocks (its cache events'
// key). needed is always written; keys smaller than needed is
// KVCM_ERR_BUFFER_TOO_SMALL (NULL with capacity 0 asks for the count).
//
//kvcm:since 2
//kvcm:thread any
//kvcm:call github.com/kvcm/kvcm/core/abimodel.BlockKeys
//kvcm:param blockKey in The block key algorithm.
//kvcm:param scope borrowed,convert The reuse scope.
//kvcm:param hasLoraID in,into=scope.HasLoRA Whether scope.lora_id is a LoRA adapter id, 0 included.
//kvcm:param tokensPerBlock in Tokens per block (positive).
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param digestPositions borrowed,nullable,len=numDigests,slice,go=uint64 The digest tokens' positions (NULL only when num_digests is 0).
//kvcm:param numDigests in The number of digest tokens.
//kvcm:param digestBytes borrowed,nullable,len=digestBytesLen,string The digests, 32 bytes each.
//kvcm:param digestBytesLen in The length of digest_bytes: 32 * num_digests.
//kvcm:param partial in Whether to key a trailing partial block too.
//kvcm:param keys out,nullable,len=capacity,buffer=needed,go=github.com/kvcm/kvcm/core/blockhash.Key Receives the keys.
//kvcm:param capacity in Capacity of keys, in elements.
//kvcm:param needed out Receives the number of keys.
type BlockKeys func(blockKey BlockKey, scope spec.In[ReuseScope], hasLoraID bool, tokensPerBlock int32, tokens spec.In[Token], numTokens spec.Size, digestPositions spec.In[spec.Size], numDigests spec.Size, digestBytes spec.CStr, digestBytesLen spec.Size, partial bool, keys spec.Out[uint64], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// KVCacheCommitDigests is kvcm_kv_cache_commit for tokens with digest
// tokens. A text-only cache (kvcm_kv_cache_options.text_only, or the
// manager's text_only) refuses digests with KVCM_ERR_INVALID_ARGUMENT.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call CommitDigestBytes
//kvcm:param cache in The cache.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param digestPositions borrowed,nullable,len=numDigests,slice,go=uint64 The digest tokens' positions in tokens.
//kvcm:param numDigests in The number of digest tokens.
//kvcm:param digestBytes borrowed,nullable,len=digestBytesLen,string The digests, 32 bytes each.
//kvcm:param digestBytesLen in The length of digest_bytes: 32 * num_digests.
//kvcm:param isEnd in Whether these are the last tokens to commit.
type KVCacheCommitDigests func(cache KVCache, tokens spec.In[Token], numTokens spec.Size, digestPositions spec.In[spec.Size], numDigests spec.Size, digestBytes spec.CStr, digestBytesLen spec.Size, isEnd bool) *Status

// KVCacheGetCommittedDigests writes the digest tokens of the committed
// tokens (kvcm_kv_cache_get_committed_tokens, whose values there are 0):
// their positions, ascending, and their 32 bytes each. needed is always
// written; a capacity smaller than needed is KVCM_ERR_BUFFER_TOO_SMALL
// (NULL buffers with capacity 0 ask for the count).
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().CommittedDigests
//kvcm:param cache in The cache.
//kvcm:param positions out,nullable,len=capacity,buffer=needed,go=github.com/kvcm/kvcm/core/blockhash.DigestAt,column=Pos Receives the positions.
//kvcm:param digestBytes out,nullable,len=capacity,column=positions.Digest Receives 32 bytes per digest (room for 32 * capacity bytes).
//kvcm:param capacity in Capacity, in digests.
//kvcm:param needed out Receives the number of digests.
type KVCacheGetCommittedDigests func(cache KVCache, positions spec.Out[spec.Size], digestBytes spec.Out[uint8], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// ManagerProbeReuseDigests is kvcm_manager_probe_reuse_v2 for input tokens
// with digest tokens.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call ProbeReuseDigests
//kvcm:param manager in The manager.
//kvcm:param scope borrowed,convert The reuse scope.
//kvcm:param hasLoraID in,into=scope.HasLoRA Whether scope.lora_id is a LoRA adapter id, 0 included.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The input tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param digestPositions borrowed,nullable,len=numDigests,slice,go=uint64 The digest tokens' positions in tokens.
//kvcm:param numDigests in The number of digest tokens.
//kvcm:param digestBytes borrowed,nullable,len=digestBytesLen,string The digests, 32 bytes each.
//kvcm:param digestBytesLen in The length of digest_bytes: 32 * num_digests.
//kvcm:param out out,result Receives the number of reusable tokens.
type ManagerProbeReuseDigests func(manager Manager, scope spec.In[ReuseScope], hasLoraID bool, tokens spec.In[Token], numTokens spec.Size, digestPositions spec.In[spec.Size], numDigests spec.Size, digestBytes spec.CStr, digestBytesLen spec.Size, out spec.Out[int64]) *Status

// ManagerProbeFirstNewBlockKeyDigests is
// kvcm_manager_probe_first_new_block_key for input tokens with digest
// tokens.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call ProbeFirstNewBlockKeyDigests
//kvcm:param manager in The manager.
//kvcm:param scope borrowed,convert The reuse scope.
//kvcm:param hasLoraID in,into=scope.HasLoRA Whether scope.lora_id is a LoRA adapter id, 0 included.
//kvcm:param tokens borrowed,nullable,len=numTokens,slice,go=github.com/kvcm/kvcm/core/config.Token The input tokens (NULL only when num_tokens is 0).
//kvcm:param numTokens in The number of tokens.
//kvcm:param digestPositions borrowed,nullable,len=numDigests,slice,go=uint64 The digest tokens' positions in tokens.
//kvcm:param numDigests in The number of digest tokens.
//kvcm:param digestBytes borrowed,nullable,len=digestBytesLen,string The digests, 32 bytes each.
//kvcm:param digestBytesLen in The length of digest_bytes: 32 * num_digests.
//kvcm:param key out,result Receives the block's key.
//kvcm:param found out,result Receives whether there is such a block.
type ManagerProbeFirstNewBlockKeyDigests func(manager Manager, scope spec.In[ReuseScope], hasLoraID bool, tokens spec.In[Token], numTokens spec.Size, digestPositions spec.In[spec.Size], numDigests spec.Size, digestBytes spec.CStr, digestBytesLen spec.Size, key spec.Out[uint64], found spec.Out[bool]) *Status

// ManagerDrainBlockEventsDigests is kvcm_manager_drain_block_events that
// also writes the multimodal digest tokens of the stored blocks it writes:
// their positions in the tokens buffer (whose tokens there are 0), and their
// 32 bytes each. digest_positions and digest_bytes have room for tokens_cap
// digests (digest_bytes for 32 * tokens_cap bytes), so an event that fits
// in tokens fits in them.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:param manager in The manager.
//kvcm:param events out,nullable,len=eventsCap Receives the events.
//kvcm:param eventsCap in Capacity of events, in elements.
//kvcm:param tokens out,nullable,len=tokensCap Receives the tokens of stored blocks.
//kvcm:param tokensCap in Capacity of tokens, in elements.
//kvcm:param digestPositions out,nullable,len=tokensCap Receives the digest tokens' positions in tokens.
//kvcm:param digestBytes out,nullable,len=tokensCap Receives 32 bytes per digest (room for 32 * tokens_cap bytes).
//kvcm:param numEvents out Receives the number of events written.
//kvcm:param numTokens out Receives the number of tokens written (on KVCM_ERR_BUFFER_TOO_SMALL, the tokens the oldest event needs).
//kvcm:param numDigests out Receives the number of digests written.
//kvcm:param dropped out,nullable Receives the number of events dropped since the previous drain.
type ManagerDrainBlockEventsDigests func(manager Manager, events spec.Out[BlockEvent], eventsCap spec.Size, tokens spec.Out[Token], tokensCap spec.Size, digestPositions spec.Out[spec.Size], digestBytes spec.Out[uint8], numEvents spec.Out[spec.Size], numTokens spec.Out[spec.Size], numDigests spec.Out[spec.Size], dropped spec.Out[uint64]) *Status
