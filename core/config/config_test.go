package config_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
)

// The contract of Validate: every error names its field (config.Error.Field,
// with the field's path) and matches config.ErrInvalid.

func valid() config.Config {
	return config.Config{
		TokensPerBlock: 4,
		CacheTiers:     []config.CacheTierConfig{config.GPU(1 << 20)},
		Layers: []config.AttentionLayerConfig{{LayerID: 0, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: 64}, {Role: config.RoleValue, Size: 64},
		}}},
	}
}

// requireField checks that err is a configuration error naming field, and
// that its message says each of contains.
func requireField(t *testing.T, err error, field string, contains ...string) {
	t.Helper()
	require.Error(t, err)
	assert.True(t, errors.Is(err, config.ErrInvalid), "matches ErrInvalid: %v", err)
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, field, ce.Field, "error: %v", err)
	for _, c := range contains {
		assert.Contains(t, err.Error(), c)
	}
}

// The zero MaxUtilForResume is unset: it validates and selects the default.
func TestZeroMaxUtilForResumeMeansTheDefault(t *testing.T) {
	cfg := valid()
	require.NoError(t, cfg.Validate(1))
	assert.Equal(t, config.DefaultMaxUtilForResume, cfg.MaxUtil())
	cfg.MaxUtilForResume = 0.5
	assert.Equal(t, 0.5, cfg.MaxUtil(), "a set value is used as is")
}

// Every error names its field: a max_util_for_resume out of (0, 1] says that
// 0 is the unset value, since the range alone would make 0 look invalid.
func TestMaxUtilForResumeOutOfRangeSaysZeroIsUnset(t *testing.T) {
	for _, u := range []float64{-0.5, 1.5, math.NaN(), math.Inf(1)} {
		cfg := valid()
		cfg.MaxUtilForResume = u
		requireField(t, cfg.Validate(1), "max_util_for_resume", "max_util_for_resume must be in (0, 1]", "0 (unset)")
	}
}

// Every error names its field: a negative reuse_match_backoff is rejected.
func TestNegativeReuseMatchBackoffIsRejected(t *testing.T) {
	cfg := valid()
	cfg.ReuseMatchBackoff = -1
	requireField(t, cfg.Validate(1), "reuse_match_backoff", "negative")
	cfg.ReuseMatchBackoff = 3
	require.NoError(t, cfg.Validate(1))
}

// Every error names its field: a NUL byte in a disk path (which the C ABI
// would silently cut) is rejected naming cache_tiers[i].path.
func TestDiskPathWithNULIsRejected(t *testing.T) {
	cfg := valid()
	dir := t.TempDir()
	cfg.CacheTiers = append(cfg.CacheTiers, config.Disk(1<<20, dir+"\x00/elsewhere"))
	requireField(t, cfg.Validate(1), "cache_tiers[1].path", "NUL byte at offset")

	cfg.CacheTiers[1].Path = dir
	require.NoError(t, cfg.Validate(1), "the path without its NUL is fine")
}

// Every error names its field: a NUL byte in a role is rejected, as the C ABI
// would cut the role there.
func TestRoleWithNULIsRejected(t *testing.T) {
	cfg := valid()
	cfg.Layers[0].Buffers[1].Role = "value\x00x"
	requireField(t, cfg.Validate(1), "layers[0].buffers[1].role", "NUL byte")
}

// Every error names its field: buffer sizes whose sum overflows int64 (so
// that a page size would wrap negative) are rejected naming the buffer that
// overflows the sum.
func TestBufferSizesThatOverflowAreRejected(t *testing.T) {
	cfg := valid()
	cfg.Layers[0].Buffers[0].Size = math.MaxInt64 / 2
	cfg.Layers[0].Buffers[1].Size = math.MaxInt64/2 + 1
	require.NoError(t, cfg.Validate(1), "exactly MaxInt64 bytes a block still fit")
	cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{LayerID: 1, Buffers: []config.BufferConfig{
		{Role: config.RoleKey, Size: 1},
	}})
	requireField(t, cfg.Validate(1), "layers[1].buffers[0].size", "beyond")
}

// Every error names its field: tokens_per_block is in [1,
// MaxTokensPerBlock], so that no block is too large to allocate the
// manager's token chunks for.
func TestTokensPerBlockOutOfRangeIsRejected(t *testing.T) {
	for _, tpb := range []int{0, -4, config.MaxTokensPerBlock + 1, math.MaxInt32} {
		cfg := valid()
		cfg.TokensPerBlock = tpb
		requireField(t, cfg.Validate(1), "tokens_per_block", "must be positive and at most 65536")
	}
	cfg := valid()
	cfg.TokensPerBlock = config.MaxTokensPerBlock
	require.NoError(t, cfg.Validate(1))
}

// The default max_util_for_resume is KVCacheManagerV2's, 0.97.
func TestDefaultMaxUtilForResumeIsKVCM2s(t *testing.T) {
	assert.Equal(t, 0.97, config.DefaultMaxUtilForResume)
}

// Every error names its field: an empty (non-nil) initial_pool_ratio is
// rejected, as KVCacheManagerV2 rejects it, while nil means unset.
func TestEmptyInitialPoolRatioIsRejected(t *testing.T) {
	cfg := valid()
	cfg.InitialPoolRatio = []float64{}
	requireField(t, cfg.Validate(1), "initial_pool_ratio", "initial_pool_ratio length", "empty list")
	cfg.InitialPoolRatio = nil
	require.NoError(t, cfg.Validate(1))
	cfg.InitialPoolRatio = []float64{1, 1}
	requireField(t, cfg.Validate(1), "initial_pool_ratio", "initial_pool_ratio length", "got 2")
}

// initial_pool_ratio sums to 1.0, as KVCacheManagerV2 requires (within its
// tolerance of 1e-6): the ratios are shares of the hot tier, not weights.
func TestInitialPoolRatioSumsToOne(t *testing.T) {
	cfg := valid()
	cfg.InitialPoolRatio = []float64{1}
	require.NoError(t, cfg.Validate(1))
	cfg.InitialPoolRatio = []float64{1 - 1e-7}
	require.NoError(t, cfg.Validate(1), "within the tolerance")
	for _, r := range [][]float64{{0.9}, {1.1}, {2}} {
		cfg.InitialPoolRatio = r
		requireField(t, cfg.Validate(1), "initial_pool_ratio", "initial_pool_ratio values must sum to 1.0")
	}
}

// Every error names its field: reuse_match_backoff and a batch's
// system_prompt_length must not be negative; a batch's requests are named
// kv_caches, as in KVCacheManagerV2.
func TestBackoffAndSystemPromptLengthAreNotNegative(t *testing.T) {
	cfg := valid()
	cfg.ReuseMatchBackoff = -1
	requireField(t, cfg.Validate(1), "reuse_match_backoff", "negative")
	cfg = valid()
	cfg.TypicalStep = &config.BatchDesc{Requests: []config.RequestDesc{{Capacity: 8}}, SystemPromptLength: -4}
	requireField(t, cfg.Validate(1), "typical_step.system_prompt_length", "negative")
	cfg.TypicalStep = &config.BatchDesc{}
	requireField(t, cfg.Validate(1), "typical_step.kv_caches", "empty")
}

// Every error names its field: the rebalance fields follow KVCacheManagerV2's
// rules, zero meaning the default for those where zero is not a valid value.
func TestRebalanceFieldsAreValidated(t *testing.T) {
	cfg := valid()
	require.NoError(t, cfg.Validate(1), "all zero: the first two are 0, the others their defaults")
	cfg.RebalanceMinSampledKVCaches, cfg.RebalanceCooldownSecs = 2000, 120
	cfg.RebalanceTargetRatioUpdateInterval, cfg.RebalanceRatioThreshold, cfg.RebalanceMovingAverageDecay = 100, 1.25, 0.9999
	require.NoError(t, cfg.Validate(1), "KVCacheManagerV2's defaults")
	for _, tc := range []struct {
		field string
		set   func(*config.Config)
	}{
		{"rebalance_min_sampled_kv_caches", func(c *config.Config) { c.RebalanceMinSampledKVCaches = -1 }},
		{"rebalance_cooldown_secs", func(c *config.Config) { c.RebalanceCooldownSecs = -1 }},
		{"rebalance_cooldown_secs", func(c *config.Config) { c.RebalanceCooldownSecs = math.Inf(1) }},
		{"rebalance_target_ratio_update_interval", func(c *config.Config) { c.RebalanceTargetRatioUpdateInterval = -5 }},
		{"rebalance_ratio_threshold", func(c *config.Config) { c.RebalanceRatioThreshold = 1 }},
		{"rebalance_ratio_threshold", func(c *config.Config) { c.RebalanceRatioThreshold = math.NaN() }},
		{"rebalance_moving_average_decay", func(c *config.Config) { c.RebalanceMovingAverageDecay = 1 }},
		{"rebalance_moving_average_decay", func(c *config.Config) { c.RebalanceMovingAverageDecay = -0.5 }},
	} {
		cfg := valid()
		tc.set(&cfg)
		requireField(t, cfg.Validate(1), tc.field)
	}
}
