package abimodel

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
)

const tpb = 4

// smallConfig: two full-attention layers (key+value, 64 bytes a block each),
// a GPU quota of `slots` pages and a host tier of as many.
func smallConfig(slots int64) config.Config {
	layer := func(id int32) config.AttentionLayerConfig {
		return config.AttentionLayerConfig{LayerID: id, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: 64}, {Role: config.RoleValue, Size: 64},
		}}
	}
	return config.Config{
		TokensPerBlock: tpb,
		CacheTiers:     []config.CacheTierConfig{config.GPU(slots * 256), config.Host(slots * 256)},
		Layers:         []config.AttentionLayerConfig{layer(0), layer(1)},
	}
}

// newManager creates a manager on the emulated device, registered in its
// own registry; the test closes it at the end unless it did.
func newManager(t *testing.T, opts Options) *Manager {
	t.Helper()
	opts.Device = backend.Emu
	if opts.Registry == nil {
		opts.Registry = &DeviceRegistry{}
	}
	m, err := New(smallConfig(16), opts)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func seq(start, n int) []config.Token {
	out := make([]config.Token, n)
	for i := range out {
		out[i] = config.Token(start + i)
	}
	return out
}

// active creates a cache for prompt, resumes it on s and commits the prompt.
func active(t *testing.T, m *Manager, s device.Stream, opts CacheOptions, prompt []config.Token) *Cache {
	t.Helper()
	opts.InputTokens = prompt
	c, err := m.CreateCache(opts)
	require.NoError(t, err)
	require.NoError(t, c.Resume(s))
	require.NoError(t, c.Resize(int64(len(prompt)), int64(len(prompt))))
	require.NoError(t, c.Commit(prompt[c.Core().NumCommittedTokens():], false))
	require.Equal(t, core.Active, c.Core().Status())
	return c
}
