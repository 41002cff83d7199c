// Package config holds the manager's configuration, mirroring
// KVCacheManagerV2's KVCacheManagerConfig, and its validation.
//
// A Config is plain data: build it as a literal, call Validate (the manager
// does so too), and every error names the offending field with its path, such
// as "layers[2].buffers[0].size".
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvcm/kvcm/core/blockhash"
)

// Token is one input token id.
type Token = int32

// DataRole names one buffer of a layer, such as "key" or "value".
type DataRole string

// Common roles.
const (
	RoleKey   DataRole = "key"
	RoleValue DataRole = "value"
)

// BufferConfig is one per-layer buffer: its role and the bytes it needs for
// one block of tokens.
//
// TokensPerBlockOverride, when not 0, gives the buffer pages of its own
// (KVCacheManagerV2's tokens_per_block_override): Size bytes hold that many
// tokens, the override divides TokensPerBlock, and each block holds
// TokensPerBlock/override of the buffer's pages side by side (its
// expansion).
type BufferConfig struct {
	Role                   DataRole
	Size                   int64
	TokensPerBlockOverride int
}

// Expansion returns how many of the buffer's pages one block of
// tokensPerBlock tokens holds: 1 without an override.
func (b BufferConfig) Expansion(tokensPerBlock int) int {
	if b.TokensPerBlockOverride == 0 {
		return 1
	}
	return tokensPerBlock / b.TokensPerBlockOverride
}

// AttentionLayerConfig describes one attention layer. SlidingWindowSize 0
// means full attention; NumSinkTokens are the leading tokens a sliding-window
// layer always keeps.
type AttentionLayerConfig struct {
	LayerID           int32
	Buffers           []BufferConfig
	SlidingWindowSize int
	NumSinkTokens     int
}

// SsmLayerConfig describes one state-space (Mamba) layer, as
// KVCacheManagerV2's SsmLayerConfig: its buffers hold one fixed-size
// recurrent state per request rather than per block of tokens, so Size is
// the bytes of the whole state. Every SSM layer belongs to the one SSM layer
// group.
type SsmLayerConfig struct {
	LayerID int32
	Buffers []BufferConfig
}

// TierKind is the kind of a cache tier.
type TierKind int

const (
	// GPUTier is device memory, where batches execute. Exactly one, first.
	GPUTier TierKind = iota
	// HostTier is mapped pinned host memory.
	HostTier
	// DiskTier is one file per cold pool group under a directory, of
	// core/blob blobs; persistent across managers with Persistent.
	DiskTier
	// SharedTier is a cold tier shared across nodes on a Redis Cluster
	// (core/sharedtier): content-addressed blobs, not slots. Last, after
	// every local tier.
	SharedTier
)

func (k TierKind) String() string {
	switch k {
	case GPUTier:
		return "gpu"
	case HostTier:
		return "host"
	case DiskTier:
		return "disk"
	case SharedTier:
		return "shared"
	}
	return fmt.Sprintf("TierKind(%d)", int(k))
}

// SharedWritePolicy says when committed blocks are written to the shared
// tier. Writes are asynchronous either way, through a bounded queue that
// never blocks the engine's calls, and skip blocks the cluster already holds.
type SharedWritePolicy int

const (
	// WriteBackOnEviction (the default) writes a block when it is evicted
	// from the last local level: the shared tier holds what no local level
	// keeps, and a hot prefix costs no cluster traffic.
	WriteBackOnEviction SharedWritePolicy = iota
	// WriteThroughOnCommit writes a block when it is committed, so other
	// nodes can reuse it at once, at the cost of writing every block.
	WriteThroughOnCommit
)

func (p SharedWritePolicy) String() string {
	switch p {
	case WriteBackOnEviction:
		return "write_back_on_eviction"
	case WriteThroughOnCommit:
		return "write_through_on_commit"
	}
	return fmt.Sprintf("SharedWritePolicy(%d)", int(p))
}

// SharedCacheTierConfig is the shared tier's cluster and policies. Its quota
// is the cluster's own: each node's maxmemory with an evicting
// maxmemory-policy (allkeys-lru, as scripts/redis-cluster.sh sets), so a
// full cluster drops the least recently used blobs, which read as misses;
// TTL bounds how long a blob lives.
type SharedCacheTierConfig struct {
	// Addresses are seed nodes of the Redis Cluster, host:port.
	Addresses []string
	// Namespace prefixes every key (1 to 64 bytes of printable ASCII
	// without spaces, ':' or braces): deployments sharing a cluster with
	// another namespace do not see each other's blobs.
	Namespace string
	// TTL is set on every blob written; 0 writes without expiry.
	TTL time.Duration
	// DialTimeout bounds connecting to a node and CallTimeout every call to
	// the cluster; 0 selects the store's defaults (2 s each).
	DialTimeout, CallTimeout time.Duration
	// WritePolicy says when blocks are written.
	WritePolicy SharedWritePolicy
	// QueueBytes bounds the bytes waiting to be written; writes beyond it
	// are dropped and counted. 0 selects the store's default (256 MiB).
	QueueBytes int64
}

// CacheTierConfig is one cache tier with its byte quota. Path is the
// directory of a disk tier. MaxQuota, for the GPU tier only, is the largest
// quota Manager.ResizeLevel may grow it to: its pools reserve that much
// address space up front so their base addresses never change (0 means
// Quota: the GPU tier can shrink and grow back, never beyond).
//
// Persistent, for the disk tier only, keeps its blob files at close: a later
// manager on the same directory whose layout fingerprint (blob size, the
// lifecycles' buffers, tokens per block, codec identity) matches finds the
// committed blocks there and reuses them. It needs a codec with an identity
// (codec.Identifier); the built-in codecs have one. Without it the tier's
// files are removed at close, and files a killed manager left are reclaimed
// at start.
//
// PoolGranularity, for the GPU tier only, is the size unit of its pools: 0
// sizes them to the byte (slots times slot size); a positive value makes
// every pool a whole number of such granules, a group getting every slot its
// granules hold; KVCM2PoolGranularity takes KVCacheManagerV2's granule for
// the quota (2 MiB up to 32 MiB, layout.GpuPoolGranularity), so the pools
// get KVCacheManagerV2's slot counts. With a granule the quota is rounded up
// to it, and the pools' floors take whole granules.
//
// A shared tier has no quota of its own (Quota 0; see
// SharedCacheTierConfig) and its settings in Shared. NewManager keeps no
// slot level for it (core/sharedlevel.go): it needs a host or disk tier,
// through which its blocks are onboarded.
type CacheTierConfig struct {
	Kind            TierKind
	Quota           int64
	Path            string
	MaxQuota        int64
	PoolGranularity int64
	Persistent      bool
	Shared          *SharedCacheTierConfig
}

// KVCM2PoolGranularity, as a GPU tier's PoolGranularity, takes
// KVCacheManagerV2's pool granule for the tier's quota.
const KVCM2PoolGranularity int64 = -1

// GPU, Host and Disk build tier configurations.
func GPU(quota int64) CacheTierConfig  { return CacheTierConfig{Kind: GPUTier, Quota: quota} }
func Host(quota int64) CacheTierConfig { return CacheTierConfig{Kind: HostTier, Quota: quota} }
func Disk(quota int64, path string) CacheTierConfig {
	return CacheTierConfig{Kind: DiskTier, Quota: quota, Path: path}
}

// Shared builds a shared tier's configuration.
func Shared(c SharedCacheTierConfig) CacheTierConfig {
	return CacheTierConfig{Kind: SharedTier, Shared: &c}
}

// RequestDesc is one request of a batch: how many tokens it holds pages for
// (0: none, only its SSM state) and how many of them are already computed.
type RequestDesc struct {
	Capacity      int
	HistoryLength int
}

// BatchDesc is one batch step (KVCacheManagerV2's BatchDesc, whose requests
// are named kv_caches). SystemPromptLength leading tokens are one prompt
// shared by every request: its full blocks are held once for the batch, not
// once per request.
type BatchDesc struct {
	Requests           []RequestDesc
	SystemPromptLength int
}

// DefaultMaxUtilForResume is used when Config.MaxUtilForResume is zero
// (unset). It is KVCacheManagerV2's default; the bindings' field defaults
// mirror it.
const DefaultMaxUtilForResume = 0.97

// InitialPoolRatioSumTolerance is how far the sum of InitialPoolRatio may be
// from 1.0 (KVCacheManagerV2's tolerance).
const InitialPoolRatioSumTolerance = 1e-6

// Defaults of the rebalance fields whose zero value means unset (0 is not a
// valid value of theirs); KVCacheManagerV2's defaults.
const (
	DefaultRebalanceTargetRatioUpdateInterval = 100
	DefaultRebalanceRatioThreshold            = 1.25
	DefaultRebalanceMovingAverageDecay        = 0.9999
)

// MaxTokensPerBlock is the largest TokensPerBlock. The manager keeps the
// tokens of its blocks in chunks of 256 blocks, allocated and faulted in
// whole, so a larger block would make a chunk of more than 64 MiB (and
// tokens_per_block 2^31-1 one of 2 TiB: the process ran out of memory in
// kvcm_manager_create instead of getting an error).
const MaxTokensPerBlock = 1 << 16

// Config is the manager's configuration.
type Config struct {
	// TokensPerBlock is in [1, MaxTokensPerBlock].
	TokensPerBlock int
	// CacheTiers are ordered from hottest to coldest: one GPU tier, then at
	// most one host tier, then at most one disk tier, then at most one
	// shared tier.
	CacheTiers []CacheTierConfig
	Layers     []AttentionLayerConfig
	// SsmLayers are the state-space layers of a hybrid model; their layer
	// ids are distinct from those of Layers. They form one layer group of
	// their own (its own hot pools) and need CommitMinSnapshot.
	SsmLayers []SsmLayerConfig
	// MaxSsmSlots caps the GPU slots of the SSM layer group (live states and
	// snapshots together); the bytes it leaves go to the attention layer
	// groups. 0 means no cap; only with SsmLayers.
	MaxSsmSlots int64
	// MaxUtilForResume: Resume refuses while the GPU tier's utilization by
	// active caches is above this fraction, in (0, 1]. Zero means unset and
	// selects DefaultMaxUtilForResume, so the zero Config (like a
	// zero-initialized C kvcm_manager_config) gets the default; a threshold
	// of exactly 0 cannot be asked for (a tiny positive fraction refuses
	// whenever active caches hold GPU pages). The Python and C++ bindings,
	// whose fields default to DefaultMaxUtilForResume, reject an explicit 0.
	MaxUtilForResume float64
	// EnablePartialReuse lets a request reuse the matching head of a cached
	// block by copying it into a private page.
	// The Python and C++ bindings default it to true (KVCacheManagerV2's
	// default); the zero Config, like a zero-initialized C config, has it off.
	EnablePartialReuse bool
	// ReuseMatchBackoff tokens are trimmed off the tail of every prefix
	// match (KVCacheManagerV2's reuse_match_backoff): for pools that also
	// hold state reading that many tokens ahead. As there it applies inside
	// the match: off the tokens the tree holds along the prompt, the match
	// being the longest usable one within the rest. Not negative.
	ReuseMatchBackoff int
	// InitialPoolRatio is one hot-tier byte ratio per layer group, in layer
	// group order. When nil, TypicalStep decides; else Constraints; else
	// every layer group gets the same number of slots. As in
	// KVCacheManagerV2, the ratios are positive and sum to 1.0 (within
	// InitialPoolRatioSumTolerance), and a non-nil empty list is invalid.
	// Constraint floors (HotFloors in package layout) still win over them.
	InitialPoolRatio []float64
	TypicalStep      *BatchDesc
	// Constraints are batches the GPU tier must always be able to hold; they
	// set floors on hot slot counts (with room for MaxUtilForResume), next
	// to each layer group's structural floor of a window's worth of slots,
	// and never affect cold tiers. As in KVCacheManagerV2, a GPU quota
	// below the floors is raised to them (the level's quota is then what
	// its pools take).
	Constraints []BatchDesc
	// EnableStats is carried for KVCacheManagerV2 parity: kvcm always
	// counts its statistics (the bindings default it to true).
	EnableStats bool
	// TextOnly promises that no request carries multimodal tokens; kvcm's
	// tokens are text only, so it changes nothing.
	TextOnly bool
	// CommitMinSnapshot (KVCacheManagerV2: commit keeps the snapshot
	// reusable at the committed length) must be set with SsmLayers: a Commit
	// that ends on a block boundary then snapshots the SSM state into that
	// block, where a later request reuses it. Without SSM layers it changes
	// nothing.
	CommitMinSnapshot bool
	// The rebalance fields tune the pool rebalancing of
	// Manager.NeedAdjustment and Manager.Adjust (KVCacheManagerV2's):
	// closing caches sample their lengths into moving averages with decay
	// RebalanceMovingAverageDecay; every RebalanceTargetRatioUpdateInterval
	// samples the target split of each level among its pool groups is
	// derived from them; a level needs adjusting once
	// RebalanceMinSampledKVCaches caches were sampled,
	// RebalanceCooldownSecs passed since the last Adjust and some pool
	// group's target is off its current size by RebalanceRatioThreshold or
	// more. Zero RebalanceTargetRatioUpdateInterval,
	// RebalanceRatioThreshold and RebalanceMovingAverageDecay mean unset
	// (their Default* constants); RebalanceMinSampledKVCaches and
	// RebalanceCooldownSecs are taken as given (0 is valid).
	RebalanceMinSampledKVCaches        int64
	RebalanceCooldownSecs              float64
	RebalanceTargetRatioUpdateInterval int64
	RebalanceRatioThreshold            float64
	RebalanceMovingAverageDecay        float64
	// SwaScratchReuse, when not nil, enables SWA scratch reuse
	// (KVCacheManagerV2's swa_scratch_reuse): during a prefill, blocks of a
	// sliding-window layer group that are out of the window by the end of
	// the step use a few shared scratch slots of the cache instead of a
	// page each (see KVCache.ScratchDesc).
	SwaScratchReuse *SwaScratchReuseConfig
	// BlockKey selects how committed blocks are keyed: blockhash.SHA256
	// (the zero value) is the specified key that other processes and the
	// bindings compute too; blockhash.XXH3 is several times cheaper but
	// matches no other process's keys (see package blockhash), so use it
	// only where keys never leave the manager.
	BlockKey blockhash.Algorithm
}

// SwaScratchReuseConfig configures SWA scratch reuse.
type SwaScratchReuseConfig struct {
	// MaxRewindLen tokens at the end of a step's capacity may be rewound
	// (rejected draft tokens) and survive as history, so their blocks never
	// use scratch slots. Not negative.
	MaxRewindLen int
}

// EnableSwaScratchReuse reports whether SwaScratchReuse is set.
func (c *Config) EnableSwaScratchReuse() bool { return c.SwaScratchReuse != nil }

// MovingAverageDecay returns RebalanceMovingAverageDecay with the default
// applied.
func (c *Config) MovingAverageDecay() float64 {
	if c.RebalanceMovingAverageDecay == 0 {
		return DefaultRebalanceMovingAverageDecay
	}
	return c.RebalanceMovingAverageDecay
}

// RatioThreshold returns RebalanceRatioThreshold with the default applied.
func (c *Config) RatioThreshold() float64 {
	if c.RebalanceRatioThreshold == 0 {
		return DefaultRebalanceRatioThreshold
	}
	return c.RebalanceRatioThreshold
}

// TargetRatioUpdateInterval returns RebalanceTargetRatioUpdateInterval with
// the default applied.
func (c *Config) TargetRatioUpdateInterval() int64 {
	if c.RebalanceTargetRatioUpdateInterval == 0 {
		return DefaultRebalanceTargetRatioUpdateInterval
	}
	return c.RebalanceTargetRatioUpdateInterval
}

// Error is a configuration error naming the offending field.
type Error struct {
	Field string
	Msg   string
}

func (e *Error) Error() string { return fmt.Sprintf("invalid config: %s: %s", e.Field, e.Msg) }

// ErrInvalid is matched by every configuration error (errors.Is).
var ErrInvalid = errors.New("invalid config")

func (e *Error) Is(target error) bool { return target == ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// MaxQuotaOrQuota returns MaxQuota, or Quota when it is unset.
func (t CacheTierConfig) MaxQuotaOrQuota() int64 {
	if t.MaxQuota == 0 {
		return t.Quota
	}
	return t.MaxQuota
}

// MaxUtil returns MaxUtilForResume with the default applied.
func (c *Config) MaxUtil() float64 {
	if c.MaxUtilForResume == 0 {
		return DefaultMaxUtilForResume
	}
	return c.MaxUtilForResume
}

// Tier returns the configuration of the tier of the given kind, if any.
func (c *Config) Tier(kind TierKind) (CacheTierConfig, bool) {
	for _, t := range c.CacheTiers {
		if t.Kind == kind {
			return t, true
		}
	}
	return CacheTierConfig{}, false
}

// LocalTiers returns CacheTiers without the shared tier: the slot-addressed
// levels the manager allocates.
func (c *Config) LocalTiers() []CacheTierConfig {
	return slices.DeleteFunc(slices.Clone(c.CacheTiers), func(t CacheTierConfig) bool { return t.Kind == SharedTier })
}

// Validate checks the configuration; numLayerGroups is the number of
// lifecycles the layers form (the layout computes it), used to check
// InitialPoolRatio's length.
func (c *Config) Validate(numLayerGroups int) error {
	if c.TokensPerBlock <= 0 || c.TokensPerBlock > MaxTokensPerBlock {
		return fieldErr("tokens_per_block", "must be positive and at most %d, got %d", MaxTokensPerBlock, c.TokensPerBlock)
	}
	if err := c.validateTiers(); err != nil {
		return err
	}
	if err := c.validateLayers(); err != nil {
		return err
	}
	if err := c.validateSsm(); err != nil {
		return err
	}
	if u := c.MaxUtilForResume; math.IsNaN(u) || u < 0 || u > 1 {
		return fieldErr("max_util_for_resume", "max_util_for_resume must be in (0, 1], or 0 (unset) for the default %v, got %v",
			DefaultMaxUtilForResume, u)
	}
	if c.ReuseMatchBackoff < 0 {
		return fieldErr("reuse_match_backoff", "must not be negative, got %d", c.ReuseMatchBackoff)
	}
	if err := c.validateRebalance(); err != nil {
		return err
	}
	if c.SwaScratchReuse != nil && c.SwaScratchReuse.MaxRewindLen < 0 {
		return fieldErr("swa_scratch_reuse.max_rewind_len", "must not be negative, got %d", c.SwaScratchReuse.MaxRewindLen)
	}
	if c.InitialPoolRatio != nil {
		if len(c.InitialPoolRatio) == 0 {
			return fieldErr("initial_pool_ratio", "initial_pool_ratio length must be one per layer group (%d), got an empty list (omit it to size from typical_step or constraints)", numLayerGroups)
		}
		if len(c.InitialPoolRatio) != numLayerGroups {
			return fieldErr("initial_pool_ratio", "initial_pool_ratio length must be one per layer group (%d), got %d",
				numLayerGroups, len(c.InitialPoolRatio))
		}
		var sum float64
		for i, r := range c.InitialPoolRatio {
			if !(r > 0) || math.IsInf(r, 0) {
				return fieldErr(fmt.Sprintf("initial_pool_ratio[%d]", i), "initial_pool_ratio values must be positive and finite, got %v", r)
			}
			sum += r
		}
		if math.Abs(sum-1) > InitialPoolRatioSumTolerance {
			return fieldErr("initial_pool_ratio", "initial_pool_ratio values must sum to 1.0 (within %v), got %v", InitialPoolRatioSumTolerance, sum)
		}
	}
	if c.BlockKey != blockhash.SHA256 && c.BlockKey != blockhash.XXH3 {
		return fieldErr("block_key", "unknown block key algorithm %d (0: sha256, 1: xxh3)", int(c.BlockKey))
	}
	if c.TypicalStep != nil {
		if err := validateBatch("typical_step", *c.TypicalStep); err != nil {
			return err
		}
	}
	for i, b := range c.Constraints {
		if err := validateBatch(fmt.Sprintf("constraints[%d]", i), b); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validateRebalance() error {
	switch {
	case c.RebalanceMinSampledKVCaches < 0:
		return fieldErr("rebalance_min_sampled_kv_caches", "must not be negative, got %d", c.RebalanceMinSampledKVCaches)
	case math.IsNaN(c.RebalanceCooldownSecs) || math.IsInf(c.RebalanceCooldownSecs, 0) || c.RebalanceCooldownSecs < 0:
		return fieldErr("rebalance_cooldown_secs", "must be finite and not negative, got %v", c.RebalanceCooldownSecs)
	case c.RebalanceTargetRatioUpdateInterval < 0:
		return fieldErr("rebalance_target_ratio_update_interval", "must be positive (0: the default %d), got %d",
			DefaultRebalanceTargetRatioUpdateInterval, c.RebalanceTargetRatioUpdateInterval)
	case c.RebalanceRatioThreshold != 0 && !(c.RebalanceRatioThreshold > 1 && !math.IsInf(c.RebalanceRatioThreshold, 0)):
		return fieldErr("rebalance_ratio_threshold", "must be finite and above 1 (0: the default %v), got %v",
			DefaultRebalanceRatioThreshold, c.RebalanceRatioThreshold)
	case c.RebalanceMovingAverageDecay != 0 && !(c.RebalanceMovingAverageDecay > 0 && c.RebalanceMovingAverageDecay < 1):
		return fieldErr("rebalance_moving_average_decay", "must be in (0, 1) (0: the default %v), got %v",
			DefaultRebalanceMovingAverageDecay, c.RebalanceMovingAverageDecay)
	}
	return nil
}

func (c *Config) validateTiers() error {
	if len(c.CacheTiers) == 0 {
		return fieldErr("cache_tiers", "needs a GPU tier")
	}
	for i, t := range c.CacheTiers {
		f := fmt.Sprintf("cache_tiers[%d]", i)
		switch {
		case t.Kind < GPUTier || t.Kind > SharedTier:
			return fieldErr(f+".kind", "unknown tier kind %d", int(t.Kind))
		case i == 0 && t.Kind != GPUTier:
			return fieldErr(f+".kind", "the first tier must be the GPU tier, got %v", t.Kind)
		case i > 0 && t.Kind <= c.CacheTiers[i-1].Kind:
			return fieldErr(f+".kind", "tiers must be gpu, then host, then disk, then shared, each at most once; %v follows %v",
				t.Kind, c.CacheTiers[i-1].Kind)
		case t.Kind != SharedTier && t.Shared != nil:
			return fieldErr(f+".shared", "only a shared tier has shared settings")
		case t.Kind == SharedTier:
			if err := validateShared(f, t); err != nil {
				return err
			}
			continue
		case t.Quota <= 0:
			return fieldErr(f+".quota", "must be positive, got %d", t.Quota)
		case t.Kind != DiskTier && t.Path != "":
			return fieldErr(f+".path", "only a disk tier has a path")
		case t.Kind != DiskTier && t.Persistent:
			return fieldErr(f+".persistent", "only a disk tier can be persistent")
		case t.Kind != GPUTier && t.MaxQuota != 0:
			return fieldErr(f+".max_quota", "only the GPU tier has a max_quota")
		case t.Kind != GPUTier && t.PoolGranularity != 0:
			return fieldErr(f+".pool_granularity", "only the GPU tier has a pool_granularity")
		case t.PoolGranularity < KVCM2PoolGranularity:
			return fieldErr(f+".pool_granularity", "must be -1 (KVCacheManagerV2's), 0 (none) or positive, got %d", t.PoolGranularity)
		case t.MaxQuota != 0 && t.MaxQuota < t.Quota:
			return fieldErr(f+".max_quota", "must be at least quota (%d), got %d", t.Quota, t.MaxQuota)
		case t.Kind == DiskTier:
			if err := checkDiskPath(f+".path", t.Path); err != nil {
				return err
			}
		}
	}
	return nil
}

func validateShared(f string, t CacheTierConfig) error {
	switch {
	case t.Quota != 0:
		return fieldErr(f+".quota", "a shared tier's quota is the cluster's maxmemory: must be 0, got %d", t.Quota)
	case t.Path != "":
		return fieldErr(f+".path", "only a disk tier has a path")
	case t.MaxQuota != 0:
		return fieldErr(f+".max_quota", "only the GPU tier has a max_quota")
	case t.Shared == nil:
		return fieldErr(f+".shared", "a shared tier needs its settings (addresses, namespace)")
	}
	s := t.Shared
	if len(s.Addresses) == 0 {
		return fieldErr(f+".addresses", "needs at least one seed address (host:port)")
	}
	for j, a := range s.Addresses {
		af := fmt.Sprintf("%s.addresses[%d]", f, j)
		if err := checkNoNUL(af, a); err != nil {
			return err
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return fieldErr(af, "%q is not host:port: %v", a, err)
		}
		if host == "" {
			return fieldErr(af, "%q has no host", a)
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return fieldErr(af, "%q has no port in 1..65535", a)
		}
	}
	if err := ValidateNamespace(s.Namespace); err != nil {
		return fieldErr(f+".namespace", "%v", err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ttl", s.TTL}, {"dial_timeout", s.DialTimeout}, {"call_timeout", s.CallTimeout}} {
		if d.v < 0 {
			return fieldErr(f+"."+d.name, "must not be negative, got %v", d.v)
		}
	}
	if s.TTL > 0 && s.TTL < time.Millisecond {
		return fieldErr(f+".ttl", "must be 0 (no expiry) or at least 1ms, got %v", s.TTL)
	}
	if s.WritePolicy != WriteBackOnEviction && s.WritePolicy != WriteThroughOnCommit {
		return fieldErr(f+".write_policy", "unknown write policy %d", int(s.WritePolicy))
	}
	if s.QueueBytes < 0 {
		return fieldErr(f+".queue_bytes", "must not be negative, got %d", s.QueueBytes)
	}
	return nil
}

// ValidateNamespace checks a shared tier's key namespace: 1 to 64 bytes of
// printable ASCII without spaces, ':' or braces (a brace would make a Redis
// hash tag and pin every key to one slot).
func ValidateNamespace(ns string) error {
	if ns == "" || len(ns) > 64 {
		return fmt.Errorf("must be 1 to 64 bytes, got %d", len(ns))
	}
	for i := 0; i < len(ns); i++ {
		if c := ns[i]; c <= ' ' || c >= 0x7f || c == '{' || c == '}' || c == ':' {
			return fmt.Errorf("byte %d (%q) is not printable ASCII other than space, ':' and braces", i, c)
		}
	}
	return nil
}

func checkDiskPath(field, path string) error {
	if path == "" {
		return fieldErr(field, "a disk tier needs a directory")
	}
	if err := checkNoNUL(field, path); err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return fieldErr(field, "%v", err)
	}
	if !info.IsDir() {
		return fieldErr(field, "%q is not a directory", path)
	}
	probe, err := os.CreateTemp(path, ".kvcm-probe-*")
	if err != nil {
		return fieldErr(field, "directory is not writable: %v", err)
	}
	name := probe.Name()
	probe.Close()
	os.Remove(filepath.Clean(name))
	return nil
}

// checkNoNUL rejects a string the C ABI could not carry: it passes paths and
// roles NUL-terminated, so a NUL byte would silently cut them.
func checkNoNUL(field, s string) error {
	if i := strings.IndexByte(s, 0); i >= 0 {
		return fieldErr(field, "contains a NUL byte at offset %d", i)
	}
	return nil
}

// validateLayers checks every layer; a model needs a layer, attention or SSM
// (a model of SSM layers only has no attention layer, as KVCacheManagerV2
// allows). The sizes of all buffers together must fit an int64, so that no
// page or pool size computed from them overflows.
func (c *Config) validateLayers() error {
	if len(c.Layers) == 0 && len(c.SsmLayers) == 0 {
		return fieldErr("layers", "needs at least one layer")
	}
	seen := make(map[int32]int, len(c.Layers))
	var total int64 // bytes of every buffer of every layer, for one block
	for i, l := range c.Layers {
		f := fmt.Sprintf("layers[%d]", i)
		if j, dup := seen[l.LayerID]; dup {
			return fieldErr(f+".layer_id", "duplicates layers[%d].layer_id (%d)", j, l.LayerID)
		}
		seen[l.LayerID] = i
		if l.SlidingWindowSize < 0 {
			return fieldErr(f+".sliding_window_size", "must not be negative, got %d", l.SlidingWindowSize)
		}
		if l.NumSinkTokens < 0 {
			return fieldErr(f+".num_sink_tokens", "must not be negative, got %d", l.NumSinkTokens)
		}
		if l.NumSinkTokens > 0 && l.SlidingWindowSize == 0 {
			return fieldErr(f+".num_sink_tokens", "sink tokens need a sliding window")
		}
		if len(l.Buffers) == 0 {
			return fieldErr(f+".buffers", "needs at least one buffer")
		}
		roles := make([]DataRole, 0, len(l.Buffers))
		for j, b := range l.Buffers {
			bf := fmt.Sprintf("%s.buffers[%d]", f, j)
			if b.Role == "" {
				return fieldErr(bf+".role", "must not be empty")
			}
			if err := checkNoNUL(bf+".role", string(b.Role)); err != nil {
				return err
			}
			if slices.Contains(roles, b.Role) {
				return fieldErr(bf+".role", "duplicate role %q in the layer", b.Role)
			}
			roles = append(roles, b.Role)
			if b.Size <= 0 {
				return fieldErr(bf+".size", "must be positive, got %d", b.Size)
			}
			if o := b.TokensPerBlockOverride; o < 0 || (o > 0 && c.TokensPerBlock%o != 0) {
				return fieldErr(bf+".tokens_per_block_override", "must divide tokens_per_block (%d), got %d", c.TokensPerBlock, o)
			}
			e := int64(b.Expansion(c.TokensPerBlock))
			block := b.Size * e
			if b.Size > math.MaxInt64/e || block > math.MaxInt64-total {
				return fieldErr(bf+".size", "%d bytes (x%d pages a block) bring the buffers of all layers beyond %d bytes a block",
					b.Size, b.Expansion(c.TokensPerBlock), int64(math.MaxInt64))
			}
			total += block
		}
	}
	return nil
}

// validateSsm checks the SSM layers: ids distinct from every other layer's,
// buffers as an attention layer's (without tokens_per_block_override),
// CommitMinSnapshot set, and MaxSsmSlots only with them.
func (c *Config) validateSsm() error {
	if c.MaxSsmSlots < 0 {
		return fieldErr("max_ssm_slots", "must not be negative, got %d", c.MaxSsmSlots)
	}
	if len(c.SsmLayers) == 0 {
		if c.MaxSsmSlots != 0 {
			return fieldErr("max_ssm_slots", "caps the SSM layer group: needs ssm_layers")
		}
		return nil
	}
	if !c.CommitMinSnapshot {
		return fieldErr("commit_min_snapshot", "must be true when SSM layers are present (%d in ssm_layers)", len(c.SsmLayers))
	}
	seen := make(map[int32]string, len(c.Layers)+len(c.SsmLayers))
	var total int64
	for i, l := range c.Layers {
		seen[l.LayerID] = fmt.Sprintf("layers[%d]", i)
		for _, b := range l.Buffers {
			total += b.Size * int64(b.Expansion(c.TokensPerBlock)) // validated: the sum fits
		}
	}
	for i, l := range c.SsmLayers {
		f := fmt.Sprintf("ssm_layers[%d]", i)
		if other, dup := seen[l.LayerID]; dup {
			return fieldErr(f+".layer_id", "duplicates %s.layer_id (%d)", other, l.LayerID)
		}
		seen[l.LayerID] = f
		if len(l.Buffers) == 0 {
			return fieldErr(f+".buffers", "needs at least one buffer")
		}
		roles := make([]DataRole, 0, len(l.Buffers))
		for j, b := range l.Buffers {
			bf := fmt.Sprintf("%s.buffers[%d]", f, j)
			if b.Role == "" {
				return fieldErr(bf+".role", "must not be empty")
			}
			if err := checkNoNUL(bf+".role", string(b.Role)); err != nil {
				return err
			}
			if slices.Contains(roles, b.Role) {
				return fieldErr(bf+".role", "duplicate role %q in the layer", b.Role)
			}
			roles = append(roles, b.Role)
			if b.Size <= 0 {
				return fieldErr(bf+".size", "must be positive, got %d", b.Size)
			}
			if b.TokensPerBlockOverride != 0 {
				// A state is one page a cache, not a block of tokens.
				return fieldErr(bf+".tokens_per_block_override", "must be 0 for an SSM layer's state, got %d",
					b.TokensPerBlockOverride)
			}
			if b.Size > math.MaxInt64-total {
				return fieldErr(bf+".size", "%d bytes bring the buffers of all layers beyond %d bytes a block",
					b.Size, int64(math.MaxInt64))
			}
			total += b.Size
		}
	}
	return nil
}

func validateBatch(field string, b BatchDesc) error {
	if len(b.Requests) == 0 {
		return fieldErr(field+".kv_caches", "must not be empty")
	}
	if b.SystemPromptLength < 0 {
		return fieldErr(field+".system_prompt_length", "must not be negative, got %d", b.SystemPromptLength)
	}
	for i, r := range b.Requests {
		f := fmt.Sprintf("%s.kv_caches[%d]", field, i)
		// 0, as in KVCacheManagerV2, is a request holding only its SSM
		// state: hybrid models' constraints reserve states that way.
		if r.Capacity < 0 {
			return fieldErr(f+".capacity", "must not be negative, got %d", r.Capacity)
		}
		if r.HistoryLength < 0 || r.HistoryLength > r.Capacity {
			return fieldErr(f+".history_length", "must be in [0, capacity=%d], got %d", r.Capacity, r.HistoryLength)
		}
	}
	return nil
}
