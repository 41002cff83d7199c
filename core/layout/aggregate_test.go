package layout_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// aggregateLayout: layers 0 and 1 with key and value buffers of 64 bytes and
// an index buffer of 16 bytes (two pools of one layer group), and layer 2, a
// sliding-window layer, with key and value of 32 bytes (a layer group of its
// own).
func aggregateLayout() *layout.Layout {
	full := func(id int32) config.AttentionLayerConfig {
		return config.AttentionLayerConfig{LayerID: id, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: 64}, {Role: config.RoleValue, Size: 64}, {Role: "index", Size: 16},
		}}
	}
	return layout.New(&config.Config{
		TokensPerBlock: 4,
		CacheTiers:     []config.CacheTierConfig{config.GPU(1 << 20)},
		Layers: []config.AttentionLayerConfig{full(0), full(1), {LayerID: 2, SlidingWindowSize: 8, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: 32}, {Role: config.RoleValue, Size: 32},
		}}},
	})
}

func key(layer int32, role config.DataRole) layout.BufferKey {
	return layout.BufferKey{Layer: layer, Role: role}
}

func expanded(keys ...layout.BufferKey) []layout.ExpandedBuffer {
	out := make([]layout.ExpandedBuffer, len(keys))
	for i, k := range keys {
		out[i] = layout.ExpandedBuffer{Buffer: k, Expansion: 1}
	}
	return out
}

// Buffers adjacent in a pool's slot merge into one run whatever order they
// are asked in; a gap splits the run; each run's stride is its pool's slot.
func TestAggregatedPagesMergeContiguousBuffers(t *testing.T) {
	lt := aggregateLayout()
	// Pool 0 of layer group 0 holds 0/key, 0/value, 1/key, 1/value (64 bytes
	// each, a 256-byte slot); pool 1 holds 0/index, 1/index.
	runs, err := lt.AggregatedPages([]layout.BufferKey{key(1, config.RoleKey), key(0, config.RoleValue), key(0, config.RoleKey)})
	require.NoError(t, err)
	assert.Equal(t, []layout.AggregatedPage{{LayerGroup: 0, Pool: 0, Offset: 0, Size: 192, SlotBytes: 256,
		Buffers: expanded(key(0, config.RoleKey), key(0, config.RoleValue), key(1, config.RoleKey))}}, runs)

	runs, err = lt.AggregatedPages([]layout.BufferKey{key(1, config.RoleValue), key(0, config.RoleKey)})
	require.NoError(t, err)
	assert.Equal(t, []layout.AggregatedPage{
		{LayerGroup: 0, Pool: 0, Offset: 0, Size: 64, SlotBytes: 256, Buffers: expanded(key(0, config.RoleKey))},
		{LayerGroup: 0, Pool: 0, Offset: 192, Size: 64, SlotBytes: 256, Buffers: expanded(key(1, config.RoleValue))},
	}, runs, "a gap splits the run")
}

// Runs come per (layer group, pool) in the order each first appears among
// the buffers asked for; every buffer lands in exactly one run.
func TestAggregatedPagesGroupByLayerGroupAndPool(t *testing.T) {
	lt := aggregateLayout()
	all := []layout.BufferKey{
		key(2, config.RoleValue), key(1, "index"), key(0, config.RoleKey), key(0, "index"),
		key(2, config.RoleKey), key(1, config.RoleValue), key(0, config.RoleValue), key(1, config.RoleKey),
	}
	runs, err := lt.AggregatedPages(all)
	require.NoError(t, err)
	assert.Equal(t, []layout.AggregatedPage{
		{LayerGroup: 1, Pool: 0, Offset: 0, Size: 64, SlotBytes: 64, Buffers: expanded(key(2, config.RoleKey), key(2, config.RoleValue))},
		{LayerGroup: 0, Pool: 1, Offset: 0, Size: 32, SlotBytes: 32, Buffers: expanded(key(0, "index"), key(1, "index"))},
		{LayerGroup: 0, Pool: 0, Offset: 0, Size: 256, SlotBytes: 256,
			Buffers: expanded(key(0, config.RoleKey), key(0, config.RoleValue), key(1, config.RoleKey), key(1, config.RoleValue))},
	}, runs)

	none, err := lt.AggregatedPages(nil)
	require.NoError(t, err)
	assert.Empty(t, none)
}

// An unknown or repeated buffer is refused, naming its position.
func TestAggregatedPagesRefuseUnknownAndRepeatedBuffers(t *testing.T) {
	lt := aggregateLayout()
	_, err := lt.AggregatedPages([]layout.BufferKey{key(0, config.RoleKey), key(3, config.RoleKey)})
	assert.ErrorContains(t, err, `buffers[1]: no buffer "key" in layer 3`)
	_, err = lt.AggregatedPages([]layout.BufferKey{key(0, "index"), key(0, config.RoleKey), key(0, "index")})
	assert.ErrorContains(t, err, `buffers[2]: buffer "index" of layer 0 is buffers[0] already`)
}
