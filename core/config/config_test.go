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
		requireField(t, cfg.Validate(1), "max_util_for_resume", "(0, 1]", "0 (unset)")
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
