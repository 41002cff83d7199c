package core

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

func bufKey(layer int32, role config.DataRole) layout.BufferKey {
	return layout.BufferKey{Layer: layer, Role: role}
}

// readRange copies size bytes at ptr back through the device.
func (f *fixture) readRange(ptr device.Ptr, size int64) []byte {
	f.t.Helper()
	host, err := f.dev.Alloc(device.HostMapped, size)
	require.NoError(f.t, err)
	defer host.Free()
	require.NoError(f.t, f.stream.BatchCopy([]device.CopyDesc{{Dst: host.Ptr(), Src: ptr, Size: size}}))
	require.NoError(f.t, f.stream.Synchronize())
	return append([]byte(nil), host.Host()...)
}

// An aggregated page desc addresses, at base + index*stride for each
// aggregated page index of a cache, exactly the bytes of its buffers' pages
// side by side in buffer order: what a disaggregated transfer moves in one
// copy per run.
func TestAggregatedPagesAddressTheBuffersPages(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c := f.open(blockhash.Scope{}, seq(0, 8))
	defer c.Close()
	want := map[layout.BufferKey][][]byte{}
	base, err := c.BasePageIndices(0)
	require.NoError(t, err)
	for i, k := range []layout.BufferKey{bufKey(0, config.RoleKey), bufKey(0, config.RoleValue), bufKey(1, config.RoleKey), bufKey(1, config.RoleValue)} {
		loc, err := f.m.Buffer(k.Layer, k.Role)
		require.NoError(t, err)
		for b, s := range base {
			want[k] = append(want[k], f.fillPage(loc, s, byte(16*i+b)))
		}
	}

	descs, err := f.m.AggregatedPages([]layout.BufferKey{bufKey(1, config.RoleValue), bufKey(0, config.RoleValue), bufKey(1, config.RoleKey)})
	require.NoError(t, err)
	require.Len(t, descs, 1, "0/value, 1/key and 1/value lie side by side")
	d := descs[0]
	assert.Equal(t, int64(192), d.Size)
	assert.Equal(t, int64(256), d.Stride, "one slot of the pool")
	assert.Equal(t, layout.LayerGroupID(0), d.LayerGroup)
	pool := f.m.PoolGroupDescs()[0].Pools[0]
	assert.Equal(t, pool.Base.Add(64), d.Base, "the run starts at 0/value, the slot's second buffer")

	idx, err := c.AggregatedPageIndices(0, 0, false)
	require.NoError(t, err)
	require.Equal(t, base, idx, "aggregated page indices are the blocks' slots")
	for b, i := range idx {
		var page []byte
		for _, eb := range d.Buffers {
			assert.Equal(t, 1, eb.Expansion)
			page = append(page, want[eb.Buffer][b]...)
		}
		assert.True(t, bytes.Equal(page, f.readRange(d.Base.Add(int64(i)*d.Stride), d.Size)), "block %d", b)
	}
}

// valid_only drops the blocks without a page; with it off they are
// BadPageIndex, so an index is also the block's position.
func TestAggregatedPageIndicesValidOnlySkipsBlocksWithoutPages(t *testing.T) {
	cfg := smallConfig(64)
	cfg.Layers[1].SlidingWindowSize = 4
	f := newFixture(t, cfg)
	swa, err := f.m.LayerGroupOf(1)
	require.NoError(t, err)
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: seq(0, 16)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(16, 16))

	all, err := c.AggregatedPageIndices(swa, 0, false)
	require.NoError(t, err)
	base, err := c.BasePageIndices(swa)
	require.NoError(t, err)
	assert.Equal(t, base, all)
	require.Equal(t, []int32{BadPageIndex, BadPageIndex, BadPageIndex}, all[:3], "out of the window")
	valid, err := c.AggregatedPageIndices(swa, 0, true)
	require.NoError(t, err)
	assert.Equal(t, all[3:], valid)
}

// Every beam has aggregated page indices: its own pages' slots, those of
// the shared prefix included, with the beam's diverging block its own.
func TestAggregatedPageIndicesAreTheBeamsPages(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	c, _, _ := openBeamCache(t, f)
	defer c.Close()
	require.NoError(t, c.SetBeamWidth(3))
	beams := beamIndices(t, c)
	for k := range beams {
		idx, err := c.AggregatedPageIndices(0, k, false)
		require.NoError(t, err)
		assert.Equal(t, beams[k], idx, "beam %d", k)
		valid, err := c.AggregatedPageIndices(0, k, true)
		require.NoError(t, err)
		assert.Equal(t, beams[k], valid, "beam %d: every block has a page", k)
	}
	assert.NotEqual(t, beams[0][2], beams[1][2], "beam 1 reads its own diverging block")
}

// A beam outside the beam width, an unknown layer group or a cache that is
// not ACTIVE is refused; unknown buffers name their position.
func TestAggregatedQueriesRefuseBadArguments(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	c := f.open(blockhash.Scope{}, seq(0, 8))
	for _, beam := range []int{-1, 1} {
		_, err := c.AggregatedPageIndices(0, beam, false)
		assert.ErrorIs(t, err, ErrInvalidArgument)
		assert.ErrorContains(t, err, "beam_id")
	}
	_, err := c.AggregatedPageIndices(0, 1, false)
	assert.ErrorContains(t, err, "beam_id: 1 out of [0, 1)")
	_, err = c.AggregatedPageIndices(2, 0, false)
	assert.ErrorContains(t, err, "layer_group_id: 2")
	require.NoError(t, c.Suspend())
	_, err = c.AggregatedPageIndices(0, 0, false)
	assert.ErrorIs(t, err, ErrInvalidState)
	require.NoError(t, c.Close())

	_, err = f.m.AggregatedPages([]layout.BufferKey{bufKey(0, config.RoleKey), bufKey(0, "index")})
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, `buffers[1]: no buffer "index" in layer 0`)
}

// The buffer queries name the argument that is wrong: layer_id for a layer
// the manager does not have, role for a layer without that buffer.
func TestBufferQueriesNameTheLayerOrTheRole(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	_, err := f.m.LayerGroupOf(9)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "layer_id: unknown layer 9")
	_, err = f.m.Buffer(9, config.RoleKey)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "layer_id: unknown layer 9")
	_, err = f.m.Buffer(0, "query")
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, `role: no buffer "query" in layer 0`)
	_, err = f.m.PageIndexUpperBound(0, "query")
	assert.ErrorContains(t, err, `role: no buffer "query" in layer 0`)
	_, err = f.m.PageIndexUpperBound(-1, config.RoleKey)
	assert.ErrorContains(t, err, "layer_id: unknown layer -1")
}

// overrideConfig: smallConfig with an "index" buffer of 16 bytes per 2
// tokens in layer 0 (tokens_per_block_override 2 of 4: expansion 2).
func overrideConfig() config.Config {
	cfg := smallConfig(16)
	cfg.Layers[0].Buffers = append(cfg.Layers[0].Buffers, config.BufferConfig{Role: "index", Size: 16, TokensPerBlockOverride: 2})
	return cfg
}

// A buffer with tokens_per_block_override holds tokens_per_block/override
// pages of its own in each block: its kernel page indices are the block's
// page times the expansion plus the sub-page, its stride the bytes of one
// sub-page, and every sub-page lies inside the block's page.
func TestTokensPerBlockOverrideExpandsTheBuffersPages(t *testing.T) {
	f := newFixture(t, overrideConfig())
	loc, err := f.m.Buffer(0, "index")
	require.NoError(t, err)
	assert.Equal(t, 2, loc.Expansion)
	assert.Equal(t, int64(32), loc.Bytes, "two 16-byte pages a block")
	assert.Equal(t, int64(16), loc.PageStride())
	conv, err := f.m.PageIndexConverter(0, "index")
	require.NoError(t, err)
	assert.Equal(t, PageIndexConverter{Scale: loc.Scale, Expansion: 2, LayerOffset: loc.Offset}, conv)

	base := []int32{3, BadPageIndex, 0}
	shared := conv.Append(nil, base, SharedIndex)
	require.Len(t, shared, 6)
	assert.Equal(t, []int64{-1, -1}, shared[2:4], "a block without a page has none of its sub-pages")
	sharedBase := loc.PoolBase.Add(loc.Offset * loc.Bytes)
	for j, b := range []int32{3, 0} {
		for i := range 2 {
			k := shared[[]int{0, 4}[j]+i]
			assert.Equal(t, loc.PoolBase.Add(loc.PageIndex(b)*loc.Bytes+int64(i)*16), sharedBase.Add(k*16),
				"block %d sub-page %d", b, i)
		}
	}
	perLayer := conv.Append(nil, base, PerLayerIndex)
	for i, k := range perLayer {
		if shared[i] >= 0 {
			assert.Equal(t, shared[i]+loc.Offset*2, k, "PER_LAYER counts from the pool's base")
		}
	}

	ub, err := f.m.PageIndexUpperBound(0, "index")
	require.NoError(t, err)
	slots := f.m.PoolGroupDescs()[0].NumSlots
	pool := f.m.PoolGroupDescs()[0].Pools[loc.Pool]
	assert.Equal(t, (pool.SlotBytes*slots-loc.Offset*loc.Bytes)/16, ub, "the pool from the buffer's base, in 16-byte pages")

	descs, err := f.m.AggregatedPages([]layout.BufferKey{bufKey(0, "index")})
	require.NoError(t, err)
	require.Len(t, descs, 1)
	assert.Equal(t, []layout.ExpandedBuffer{{Buffer: bufKey(0, "index"), Expansion: 2}}, descs[0].Buffers)
	assert.Equal(t, int64(32), descs[0].Size)
}

// Without an override a buffer's expansion is 1: the converter is the
// buffer location's scale and offset.
func TestPageIndexConverterWithoutOverrideIsScaleAndOffset(t *testing.T) {
	f := newFixture(t, smallConfig(16))
	loc, err := f.m.Buffer(1, config.RoleValue)
	require.NoError(t, err)
	conv, err := f.m.PageIndexConverter(1, config.RoleValue)
	require.NoError(t, err)
	assert.Equal(t, PageIndexConverter{Scale: 4, Expansion: 1, LayerOffset: 3}, conv)
	assert.Equal(t, []int64{8, -1}, conv.Append(nil, []int32{2, BadPageIndex}, SharedIndex))
	assert.Equal(t, []int64{loc.PageIndex(2), -1}, conv.Append(nil, []int32{2, BadPageIndex}, PerLayerIndex))
	assert.Equal(t, loc.Bytes, loc.PageStride())
	_, err = f.m.PageIndexConverter(1, "index")
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

// An override must divide tokens_per_block; the error names the field.
func TestTokensPerBlockOverrideMustDivideTokensPerBlock(t *testing.T) {
	for _, o := range []int{3, 8, -1} {
		cfg := overrideConfig()
		cfg.Layers[0].Buffers[2].TokensPerBlockOverride = o
		_, err := NewManager(cfg)
		assert.ErrorContains(t, err, "layers[0].buffers[2].tokens_per_block_override", "override %d", o)
	}
}
