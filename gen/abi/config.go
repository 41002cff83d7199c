package abi

import "github.com/kvcm/kvcm/gen/spec"

// CacheTierConfig is one cache tier with its byte quota.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/config.CacheTierConfig
//kvcm:cppvalue CacheTierConfig
//kvcm:cppdoc One cache tier. Quotas are bytes. maxQuota (GPU only) is the largest quota
//kvcm:cppdoc resizeLevel may grow the tier to (0: quota). path is a disk tier's directory.
//kvcm:cppdoc persistent (disk only) keeps the disk tier's files when the manager is
//kvcm:cppdoc destroyed: a later manager on path with the same layout fingerprint (blob
//kvcm:cppdoc size, each lifecycle's buffers in order, tokens per block, window, codec
//kvcm:cppdoc identity) reuses the committed blocks there, also after the process was
//kvcm:cppdoc killed. It needs a codec with an identity (the built-in codec has one; a
//kvcm:cppdoc ColdPageCodec implemented in C++ none: KVCM_ERR_INVALID_CONFIG naming
//kvcm:cppdoc cache_tiers[i].persistent); a second live manager on path fails with
//kvcm:cppdoc KVCM_ERR_INVALID_STATE. Without it the files are removed at destroy and
//kvcm:cppdoc those a killed manager left are reclaimed at create.
//kvcm:cppfield persistent bool false | Keeps a disk tier's files (kvcm_manager_config.disk_persistent).
//kvcm:cppvariant GpuCacheTierConfig kind=kGpu args=quota:quotaBytes,maxQuota:maxQuotaBytes=0
//kvcm:cppvariant HostCacheTierConfig kind=kHost args=quota:quotaBytes
//kvcm:cppvariant DiskCacheTierConfig kind=kDisk args=quota:quotaBytes,path:directory,persistent:persistentTier=false
//kvcm:pyvariant GpuCacheTierConfig kind=GPU fields=quota,max_quota=None,pool_granularity
//kvcm:pyvariantfield GpuCacheTierConfig pool_granularity int -1 into=gpu_pool_granularity | The GPU pools' size unit (kvcm_manager_config.gpu_pool_granularity): -1, KVCacheManagerV2's granule for the quota; 0, to the byte; else bytes.
//kvcm:pyvariant HostCacheTierConfig kind=HOST fields=quota
//kvcm:pyvariant DiskCacheTierConfig kind=DISK fields=quota,path,persistent
//kvcm:pyvariantfield DiskCacheTierConfig persistent bool False into=disk_persistent | Keeps the tier's files (kvcm_manager_config.disk_persistent).
type CacheTierConfig struct {
	// Kind is the tier kind; tiers are ordered gpu, then host, then disk,
	// each at most once, the GPU tier first.
	Kind TierKind `py:"tier"`
	// Quota is the tier's byte quota (positive).
	Quota int64
	// MaxQuota, for the GPU tier only, is the largest quota
	// kvcm_manager_resize_level may grow it to (0 means quota).
	MaxQuota int64
	// Path is the directory of a disk tier (NULL for other tiers). It is
	// NUL-terminated, so bindings reject a path containing a NUL byte
	// rather than cut it.
	Path spec.CStr `nullable:"true" own:"borrowed" pytype:"path"`
}

// SharedTierConfig is a cold tier shared across nodes on a Redis Cluster,
// after every local tier: content-addressed blobs found by layout
// fingerprint, lifecycle and block key. Its quota is the cluster's
// maxmemory with an evicting policy; ttl_ms bounds a blob's life. It needs
// a host or disk tier before it, through which its blocks are onboarded.
// create_kv_cache and probe_reuse continue the prefix match into it; blocks
// reach it on eviction from the last local level (write-back, the default)
// or on commit (write-through). An unreachable cluster costs misses, never
// errors: the manager reconnects on its own.
//
//kvcm:struct
//kvcm:since 2
//kvcm:cppns c
//kvcm:cppvalue SharedCacheTierConfig order=addresses,ns,ttlMs,dialTimeoutMs,callTimeoutMs,queueBytes,writePolicy
//kvcm:cppdoc The shared tier: a cold tier shared across nodes on a Redis Cluster, after
//kvcm:cppdoc every local tier (kvcm_shared_tier_config). addresses are seed nodes
//kvcm:cppdoc ("host:port"); ns prefixes every key (1 to 64 bytes of printable ASCII
//kvcm:cppdoc without spaces, ':' or braces). Its quota is the cluster's maxmemory with an
//kvcm:cppdoc evicting policy; ttlMs (0: no expiry) bounds a blob's life. Timeouts and
//kvcm:cppdoc queueBytes of 0 select the defaults (2000 ms, 256 MiB). It needs a host or
//kvcm:cppdoc disk tier before it, through which its blocks are onboarded; createKvCache
//kvcm:cppdoc and probeReuse continue the prefix match into it, and blocks reach it on
//kvcm:cppdoc eviction from the last local level (write-back, the default) or on commit
//kvcm:cppdoc (write-through). An unreachable cluster costs misses.
//kvcm:cppfield addresses std::vector<std::string> | The seed nodes, one host:port each (the C struct joins them with commas).
//kvcm:pyconfig SharedCacheTierConfig order=addresses,namespace,ttl_ms,dial_timeout_ms,call_timeout_ms,queue_bytes,write_policy
//kvcm:pyfield addresses list[str] | The seed nodes, one "host:port" each (the C struct joins them with commas).
//kvcm:go in github.com/kvcm/kvcm/core/abimodel.SharedTierConfig
type SharedTierConfig struct {
	// Addresses are the cluster's seed nodes, host:port, comma-separated.
	Addresses spec.CStr `nullable:"true" own:"borrowed" cpp:"-" py:"-"`
	// KeyNamespace prefixes every key: 1 to 64 bytes of printable ASCII
	// without spaces, ':' or braces. (Not "namespace", a C++ keyword.)
	KeyNamespace spec.CStr `nullable:"true" own:"borrowed" cpp:"ns" path:"namespace" py:"namespace"`
	// TTLMs is the time to live of every blob written, in milliseconds (0:
	// no expiry).
	TTLMs int64 `pydefault:"0"`
	// DialTimeoutMs bounds connecting to a node, in milliseconds (0: 2000).
	DialTimeoutMs int64 `pydefault:"0"`
	// CallTimeoutMs bounds every call to the cluster, in milliseconds (0:
	// 2000).
	CallTimeoutMs int64 `pydefault:"0"`
	// QueueBytes bounds the bytes waiting to be written; writes beyond it
	// are dropped and counted (0: 256 MiB).
	QueueBytes int64 `pydefault:"0"`
	// WritePolicy says when blocks are written.
	WritePolicy SharedWritePolicy `pydefault:"WRITE_BACK_ON_EVICTION"`
}

// BufferConfig is one per-layer buffer: its role and the bytes it needs for
// one block of tokens.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/config.BufferConfig
//kvcm:cppvalue BufferConfig
//kvcm:cppdoc One per-layer buffer: its role ("key", "value", ...) and its bytes per block.
//kvcm:cppdoc tokensPerBlockOverride (KVCacheManagerV2's tokens_per_block_override), when
//kvcm:cppdoc not 0, divides tokens_per_block: size then holds that many tokens and each
//kvcm:cppdoc block holds tokens_per_block / tokensPerBlockOverride of the buffer's pages.
//kvcm:pyconfig BufferConfig
//kvcm:pyfield tokens_per_block_override int|None None | The buffer's tokens per block (kvcm_manager_config.buffer_tokens_per_block_overrides; None: none).
//kvcm:cppfield tokensPerBlockOverride std::int32_t 0 | The buffer's tokens per block (kvcm_manager_config.buffer_tokens_per_block_overrides; 0: none).
type BufferConfig struct {
	// Role names the buffer within its layer, such as "key" or "value".
	Role spec.CStr `own:"borrowed"`
	// Size is the buffer's bytes per block (positive).
	Size int64
}

// AttentionLayerConfig describes one attention layer.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/config.AttentionLayerConfig
//kvcm:cppvalue AttentionLayerConfig order=layerId,buffers,slidingWindowSize,numSinkTokens
//kvcm:pyconfig AttentionLayerConfig order=layer_id,buffers,sliding_window_size,num_sink_tokens
//kvcm:cppdoc One attention layer. slidingWindowSize 0 is full attention; numSinkTokens
//kvcm:cppdoc are the leading tokens a sliding-window layer always keeps.
type AttentionLayerConfig struct {
	// LayerID is the layer's id, unique in the configuration.
	LayerID int32
	// SlidingWindowSize is the attention window in tokens; 0 is full
	// attention.
	SlidingWindowSize int32 `pydefault:"None"`
	// NumSinkTokens are the leading tokens a sliding-window layer always
	// keeps.
	NumSinkTokens int32 `pydefault:"None"`
	// Buffers are the layer's buffers.
	Buffers spec.In[BufferConfig] `len:"NumBuffers" own:"borrowed"`
	// NumBuffers is the length of buffers (at least 1).
	NumBuffers spec.Size
}

// SsmLayerConfig describes one state-space (Mamba) layer
// (KVCacheManagerV2's SsmLayerConfig): its buffers hold one fixed-size state
// per request, so a buffer's size is the bytes of the whole state. The SSM
// layers form one layer group, after every attention layer group.
//
//kvcm:struct
//kvcm:since 2
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/config.SsmLayerConfig
//kvcm:cppvalue SsmLayerConfig
//kvcm:pyconfig SsmLayerConfig
//kvcm:cppdoc One state-space (Mamba) layer (TensorRT-LLM's SsmLayerConfig): its buffers
//kvcm:cppdoc hold one fixed-size state per request, so a buffer's size is the bytes of
//kvcm:cppdoc the whole state. The SSM layers form one layer group, after the attention
//kvcm:cppdoc ones.
type SsmLayerConfig struct {
	// LayerID is the layer's id, unique among every layer of the
	// configuration, attention layers included.
	LayerID int32
	// Buffers are the layer's state buffers.
	Buffers spec.In[BufferConfig] `len:"NumBuffers" own:"borrowed"`
	// NumBuffers is the length of buffers (at least 1).
	NumBuffers spec.Size
}

// RequestDesc is one request of a batch: how many tokens it holds pages for
// and how many of them are already computed.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/config.RequestDesc
//kvcm:cppvalue RequestDesc
//kvcm:pyconfig KVCacheDesc
type RequestDesc struct {
	// Capacity is the request's tokens with pages (not negative; 0 holds
	// only its SSM state, as in KVCacheManagerV2's hybrid constraints).
	Capacity int64
	// HistoryLength is the request's computed tokens, in [0, capacity].
	HistoryLength int64
}

// BatchDesc is one batch step.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/config.BatchDesc
//kvcm:cppvalue BatchDesc
//kvcm:pyconfig BatchDesc
//kvcm:pyfield system_prompt_length int 0 | Leading tokens every request shares: their full blocks count once (kvcm_manager_config's system prompt lengths).
//kvcm:cppfield systemPromptLength std::int64_t 0 | Leading tokens every request shares: their full blocks count once (kvcm_manager_config's system prompt lengths).
type BatchDesc struct {
	// Requests are the batch's requests (at least 1).
	Requests spec.In[RequestDesc] `len:"NumRequests" own:"borrowed" py:"kv_caches"`
	// NumRequests is the length of requests.
	NumRequests spec.Size
}

// ManagerConfig is the manager's configuration, mirroring
// KVCacheManagerV2's KVCacheManagerConfig. Every pointer is borrowed for the
// call to kvcm_manager_create only. Zero-initialize it and set struct_size =
// sizeof(kvcm_manager_config) and abi_version = KVCM_ABI_VERSION.
//
//kvcm:struct
//kvcm:versioned
//kvcm:since 1
//kvcm:cppns c
//kvcm:go in github.com/kvcm/kvcm/core/abimodel.ManagerConfig
//kvcm:cppvalue KVCacheManagerConfig order=tokensPerBlock,cacheTiers,layers,ssmLayers,maxSsmSlots,maxUtilForResume,enablePartialReuse,enableStats,initialPoolRatio,typicalStep,constraints,reuseMatchBackoff,textOnly,commitMinSnapshot,rebalanceMinSampledKvCaches,rebalanceCooldownSecs,rebalanceTargetRatioUpdateInterval,rebalanceRatioThreshold,rebalanceMovingAverageDecay,device,deviceOrdinal,eventQueueCapacity,blockKey,sharedTier,swaScratchReuse
//kvcm:cppdoc The manager's configuration, mirroring the Go config (and TensorRT-LLM's
//kvcm:cppdoc KVCacheManagerConfig), with KVCacheManagerV2's defaults. Unlike the C
//kvcm:cppdoc struct, a field's 0 is taken as given: an explicit maxUtilForResume of 0 is
//kvcm:cppdoc rejected (C would read it as unset, i.e. the default).
//kvcm:cppfield sharedTier std::optional<SharedCacheTierConfig> | The shared tier, after cacheTiers (errors name it cache_tiers[cacheTiers.size()]).
//kvcm:cppfield swaScratchReuse std::optional<SwaScratchReuseConfig> | SWA scratch reuse (TensorRT-LLM's swa_scratch_reuse; KVCache::scratchDesc); nullopt: off.
//kvcm:pyconfig KVCacheManagerConfig order=tokens_per_block,cache_tiers,layers,max_util_for_resume,enable_partial_reuse,reuse_match_backoff,constraints,typical_step,initial_pool_ratio,swa_scratch_reuse,commit_min_snapshot,enable_stats,text_only,rebalance_min_sampled_kv_caches,rebalance_cooldown_secs,rebalance_target_ratio_update_interval,rebalance_ratio_threshold,rebalance_moving_average_decay,block_key,max_ssm_slots
//kvcm:pydoc The fields of kvcm.KVCacheManagerConfig (TensorRT-LLM's names, order and
//kvcm:pydoc defaults) with the conversion of those kvcm_manager_config shares.
//kvcm:pyfield cache_tiers list[CacheTierConfig] | The tiers, hottest first, the shared tier last (the C struct carries it apart).
//kvcm:pyfield layers list[AttentionLayerConfig|SsmLayerConfig] | The layers; the C struct carries the SSM layers apart.
//kvcm:pyfield swa_scratch_reuse SwaScratchReuseConfig|None None | SWA scratch reuse (TensorRT-LLM's swa_scratch_reuse); None: off.
//kvcm:cppmethod [[nodiscard]] bool enableSwaScratchReuse() const noexcept { return swaScratchReuse.has_value(); }
type ManagerConfig struct {
	// TokensPerBlock is the number of tokens of one block (page), in [1, 65536].
	TokensPerBlock int32
	// Device selects the device (KVCM_DEVICE_AUTO by default).
	Device DeviceKind `py:"-"`
	// DeviceOrdinal selects which CUDA device (0 by default).
	DeviceOrdinal int32 `py:"-"`
	// EventQueueCapacity bounds the queue of cache events that
	// kvcm_manager_drain_events returns; events beyond it are dropped and
	// counted. 0 means KVCM_DEFAULT_EVENT_QUEUE_CAPACITY.
	EventQueueCapacity uint32 `py:"-"`
	// CacheTiers are ordered from hottest to coldest: one GPU tier, then at
	// most one host tier, then at most one disk tier.
	CacheTiers spec.In[CacheTierConfig] `len:"NumCacheTiers" own:"borrowed" py:"-"`
	// NumCacheTiers is the length of cache_tiers.
	NumCacheTiers spec.Size
	// Layers are the attention layers.
	Layers spec.In[AttentionLayerConfig] `len:"NumLayers" own:"borrowed" py:"-"`
	// NumLayers is the length of layers.
	NumLayers spec.Size
	// MaxUtilForResume: resume is refused while the GPU tier's utilization
	// by active caches is above this fraction, in (0, 1]. 0 means unset and
	// selects the default (0.97), so a zero-initialized config gets the
	// default; a threshold of exactly 0 cannot be asked for.
	MaxUtilForResume float64 `cppdefault:"0.97" pydefault:"0.97"`
	// EnablePartialReuse lets a request reuse the matching head of a cached
	// block by copying it into a private page.
	EnablePartialReuse bool `pydefault:"True"`
	// EnableStats enables statistics collection.
	EnableStats bool `pydefault:"True"`
	// InitialPoolRatio is one hot-tier byte ratio per layer group, in layer
	// group order (NULL when unused; non-NULL with length 0 is invalid): positive values
	// summing to 1.0 (within 1e-6). When empty, typical_step decides; else
	// constraints; else every layer group gets the same number of slots.
	InitialPoolRatio spec.In[float64] `len:"NumInitialPoolRatio" nullable:"true" own:"borrowed" pydefault:"None"`
	// NumInitialPoolRatio is the length of initial_pool_ratio.
	NumInitialPoolRatio spec.Size
	// TypicalStep is a typical batch step (NULL when unused).
	TypicalStep spec.In[BatchDesc] `nullable:"true" own:"borrowed" pydefault:"None"`
	// Constraints are batches the GPU tier must always be able to hold:
	// floors on the hot slot counts (with room for max_util_for_resume),
	// next to each layer group's floor of a window's worth of slots; a GPU
	// quota below the floors is raised to them, as in KVCacheManagerV2.
	Constraints spec.In[BatchDesc] `len:"NumConstraints" nullable:"true" own:"borrowed" pydefault:"[]"`
	// NumConstraints is the length of constraints.
	NumConstraints spec.Size
	// ReuseMatchBackoff tokens are trimmed off the tail of every prefix
	// match (not negative).
	ReuseMatchBackoff int32 `since:"2" pydefault:"0"`
	// TextOnly promises that no request carries multimodal tokens (kvcm's
	// tokens are text only: it changes nothing).
	TextOnly bool `since:"2" pydefault:"False"`
	// CommitMinSnapshot is KVCacheManagerV2's commit_min_snapshot, required
	// with ssm_layers: a commit that ends on a block boundary snapshots the
	// SSM state into that block for reuse. Without SSM layers it changes
	// nothing.
	CommitMinSnapshot bool `since:"2" pydefault:"False"`
	// RebalanceMinSampledKVCaches (not negative) and RebalanceCooldownSecs
	// (finite, not negative) are taken as given; 0 in
	// RebalanceTargetRatioUpdateInterval, RebalanceRatioThreshold and
	// RebalanceMovingAverageDecay means the default (100, 1.25, 0.9999).
	// They tune pool rebalancing (kvcm_manager_need_adjustment,
	// kvcm_manager_adjust), with KVCacheManagerV2's meaning and rules.
	RebalanceMinSampledKVCaches int64 `since:"2" cppdefault:"2000" pydefault:"2000"`
	// RebalanceCooldownSecs: see rebalance_min_sampled_kv_caches.
	RebalanceCooldownSecs float64 `since:"2" cppdefault:"120.0" pydefault:"120.0"`
	// RebalanceTargetRatioUpdateInterval: see rebalance_min_sampled_kv_caches.
	RebalanceTargetRatioUpdateInterval int64 `since:"2" cppdefault:"100" pydefault:"100"`
	// RebalanceRatioThreshold: see rebalance_min_sampled_kv_caches.
	RebalanceRatioThreshold float64 `since:"2" cppdefault:"1.25" pydefault:"1.25"`
	// RebalanceMovingAverageDecay: see rebalance_min_sampled_kv_caches.
	RebalanceMovingAverageDecay float64 `since:"2" cppdefault:"0.9999" pydefault:"0.9999"`
	// TypicalStepSystemPromptLength is typical_step's system prompt: its
	// leading tokens shared by every request, whose full blocks the batch
	// holds once (not negative).
	TypicalStepSystemPromptLength int64 `since:"2" cpp:"-" py:"-"`
	// ConstraintSystemPromptLengths are the constraints' system prompt
	// lengths, one per constraint, or NULL for none.
	ConstraintSystemPromptLengths spec.In[int64] `len:"NumConstraintSystemPromptLengths" nullable:"true" own:"borrowed" since:"2" cpp:"-" py:"-"`
	// NumConstraintSystemPromptLengths is 0 or num_constraints.
	NumConstraintSystemPromptLengths spec.Size `since:"2"`
	// BlockKey selects how committed blocks are keyed
	// (KVCM_BLOCK_KEY_SHA256 by default).
	BlockKey BlockKey `since:"2" pydefault:"SHA256"`
	// SharedTier is the shared tier after cache_tiers' local tiers (NULL
	// for none).
	SharedTier spec.In[SharedTierConfig] `nullable:"true" own:"borrowed" since:"2" cpp:"-" py:"-"`
	// DiskPersistent makes the disk tier (the last of cache_tiers)
	// persistent: its blob files stay at destroy, and a later manager on the
	// same directory with the same layout fingerprint (blob size, each
	// lifecycle's buffers in order, tokens per block, window, codec
	// identity) reuses the committed blocks there, also after the process
	// was killed. It needs a codec with an identity: the built-in codec (a
	// NULL codec argument, or kvcm_create_default_cold_page_codec's) has
	// one, a codec implemented in C none.
	// Errors name it as cache_tiers[i].persistent, i the last
	// local tier: set on a tier list without a disk tier or with a codec
	// without an identity it is KVCM_ERR_INVALID_CONFIG; a directory another
	// live manager holds is KVCM_ERR_INVALID_STATE. false (the default)
	// removes the tier's files at destroy and reclaims those a killed
	// manager left at create.
	DiskPersistent bool `since:"2" cpp:"-" py:"-"`
	// SwaScratchReuse enables SWA scratch reuse (KVCacheManagerV2's
	// swa_scratch_reuse): a step's blocks of a sliding-window layer group
	// that are out of the window by the end of the step get no page but
	// share the cache's scratch slots (kvcm_kv_cache_get_scratch_desc).
	SwaScratchReuse bool `since:"2" cpp:"-" py:"-"`
	// SwaScratchMaxRewindLen is swa_scratch_reuse.max_rewind_len: the
	// step's last tokens that may be rewound and survive as history, whose
	// blocks always get pages (not negative; read with swa_scratch_reuse
	// only).
	SwaScratchMaxRewindLen int64 `since:"2" cpp:"-" py:"-"`
	// SsmLayers are the state-space layers of a hybrid model (NULL for
	// none); they need commit_min_snapshot. Errors name them as
	// ssm_layers[i].
	SsmLayers spec.In[SsmLayerConfig] `len:"NumSsmLayers" nullable:"true" own:"borrowed" since:"2" py:"-"`
	// NumSsmLayers is the length of ssm_layers.
	NumSsmLayers spec.Size `since:"2"`
	// MaxSsmSlots caps the GPU slots of the SSM layer group (live states and
	// snapshots); the bytes it leaves go to the attention layer groups. 0:
	// no cap; only with ssm_layers.
	MaxSsmSlots int64 `since:"2" pydefault:"0"`
	// BufferTokensPerBlockOverrides are the buffers' tokens_per_block
	// overrides (KVCacheManagerV2's BufferConfig.tokens_per_block_override),
	// one per buffer of every layer in configuration order (layers[0]'s
	// buffers first), 0 for none; or NULL for none at all. An override
	// divides tokens_per_block: the buffer's size then holds that many
	// tokens, and each block holds tokens_per_block/override of its pages.
	BufferTokensPerBlockOverrides spec.In[int32] `len:"NumBufferTokensPerBlockOverrides" nullable:"true" own:"borrowed" since:"2" cpp:"-" py:"-"`
	// NumBufferTokensPerBlockOverrides is 0 or the number of buffers of all
	// layers.
	NumBufferTokensPerBlockOverrides spec.Size `since:"2"`
	// GpuPoolGranularity is the GPU tier's pool granularity (errors name
	// it cache_tiers[0].pool_granularity): 0 (the default) sizes the GPU
	// pools to the byte; a positive value makes every GPU pool a whole
	// number of such granules, a pool group getting every slot its granules
	// hold and a typical_step weighing each pool group's pages by the
	// granules they take (every pool rounded up, as KVCacheManagerV2 sizes
	// a typical step); -1 takes KVCacheManagerV2's granule for the quota (2 MiB, doubled
	// for every doubling of the quota from 1 GiB on, at most 32 MiB), so the
	// pools get KVCacheManagerV2's slot counts. With a granule the GPU quota
	// is rounded up to it.
	GpuPoolGranularity int64 `since:"2" cpp:"-" py:"-"`
}
