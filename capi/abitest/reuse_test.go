package abitest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serveV2 creates a cache in sc for tokens, resumes it on s, commits every
// token (which advances the history) and closes it.
func serveV2(t *testing.T, m, s uint64, sc Scope, tokens []int32) {
	t.Helper()
	c, err := CreateCacheV2(m, sc, tokens, false, 0)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	info, err := GetCacheInfo(c)
	require.NoError(t, err)
	require.NoError(t, Resize(c, int64(len(tokens)), -1))
	require.NoError(t, Commit(c, tokens[info.Committed:], false))
	require.NoError(t, CloseCache(c))
}

// A fully cached prompt is reused whole, and reuse_match_backoff trims the
// match, through the C ABI as in Go.
func TestFullyCachedPromptIsReusedWholeAndBackoffTrims(t *testing.T) {
	noLeaks(t)
	for _, back := range []int32{0, 1} {
		cfg := smallConfig(8, 0)
		cfg.ReuseMatchBackoff = back
		m, err := CreateManager(cfg, nil)
		require.NoError(t, err)
		s, err := CreateStream(m)
		require.NoError(t, err)
		serveV2(t, m, s, Scope{}, seq(1, 8))
		n, err := ProbeReuse(m, 0, "", seq(1, 8))
		require.NoError(t, err)
		assert.Equal(t, map[int32]int64{0: 8, 1: 4}[back], n, "backoff %d", back)
		require.NoError(t, DestroyManager(m))
	}
}

// LoRA adapter 0 (has_lora_id set) and no adapter are different scopes; the
// version 1 probe and options keep lora_id 0 meaning no adapter.
func TestLoRAZeroIsAScopeOfItsOwn(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer DestroyManager(m)
	s, err := CreateStream(m)
	require.NoError(t, err)
	serveV2(t, m, s, Scope{HasLoRA: true}, seq(1, 8))
	n, err := ProbeReuseV2(m, Scope{HasLoRA: true}, seq(1, 8))
	require.NoError(t, err)
	assert.Equal(t, int64(8), n)
	n, err = ProbeReuseV2(m, Scope{}, seq(1, 8))
	require.NoError(t, err)
	assert.Zero(t, n, "no adapter")
	n, err = ProbeReuse(m, 0, "", seq(1, 8))
	require.NoError(t, err)
	assert.Zero(t, n, "version 1: lora_id 0 is no adapter")

	// Options of ABI version 1 (no scope_has_lora_id) create a no-adapter cache.
	c, err := CreateCacheV2(m, Scope{HasLoRA: true}, seq(1, 8), false, CacheOptionsSizeV1)
	require.NoError(t, err)
	info, err := GetCacheInfo(c)
	require.NoError(t, err)
	assert.Zero(t, info.ReusedToken, "has_lora_id beyond struct_size is not read")
	require.NoError(t, CloseCache(c))
}

// probe_first_new_block_key names the first full block past the reusable
// prefix, or reports none.
func TestProbeFirstNewBlockKey(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer DestroyManager(m)
	s, err := CreateStream(m)
	require.NoError(t, err)
	k0, found, err := ProbeFirstNewBlockKey(m, Scope{}, seq(1, 12))
	require.NoError(t, err)
	require.True(t, found)
	serveV2(t, m, s, Scope{}, seq(1, 4))
	k1, found, err := ProbeFirstNewBlockKey(m, Scope{}, seq(1, 12))
	require.NoError(t, err)
	require.True(t, found)
	assert.NotEqual(t, k0, k1, "the second block now")
	_, found, err = ProbeFirstNewBlockKey(m, Scope{}, seq(1, 7))
	require.NoError(t, err)
	assert.False(t, found)
}

// clear_reusable_blocks and the open-cache count: clearing refuses while a
// cache is open and drops every committed block otherwise.
func TestClearReusableBlocksAndOpenCaches(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer DestroyManager(m)
	s, err := CreateStream(m)
	require.NoError(t, err)
	serveV2(t, m, s, Scope{}, seq(1, 8))
	c, err := CreateCacheV2(m, Scope{}, nil, false, 0)
	require.NoError(t, err)
	n, err := NumOpenCaches(m)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	requireCode(t, ClearReusableBlocks(m), InvalidState, "1 KV caches still open")
	require.NoError(t, CloseCache(c))
	n, err = NumOpenCaches(m)
	require.NoError(t, err)
	assert.Zero(t, n)
	require.NoError(t, ClearReusableBlocks(m))
	r, err := ProbeReuse(m, 0, "", seq(1, 8))
	require.NoError(t, err)
	assert.Zero(t, r)
}

// The per-layer-group priority callback is called once per layer group of
// every committed block; it excludes the version 1 callback.
func TestLayerGroupPriorityCallback(t *testing.T) {
	noLeaks(t)
	cfg := smallConfig(16, 0)
	cfg.Layers[1].Window = 8
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err)
	defer DestroyManager(m)
	s, err := CreateStream(m)
	require.NoError(t, err)
	LayerGroupPriorityCalls()
	c, err := CreateCacheV2(m, Scope{}, nil, true, 0)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 8, -1))
	require.NoError(t, Commit(c, seq(1, 8), false))
	assert.Equal(t, [][2]int64{{0, 0}, {0, 1}, {1, 0}, {1, 1}}, LayerGroupPriorityCalls())
	require.NoError(t, CloseCache(c))
	requireCode(t, CreateCacheBothPriorities(m), InvalidArgument, "layer_group_priority")
}

// Streams: any handle the engine owns is a stream (on the emulated device
// each value an emulated stream of its own), set_stream moves a cache, and
// the committed tokens read back.
func TestResumeOnLastStreamSetStreamAndCommittedTokens(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer DestroyManager(m)
	s, err := CreateStream(m)
	require.NoError(t, err)
	s2, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCacheV2(m, Scope{}, nil, false, 0)
	require.NoError(t, err)
	if testDevice() == 1 { // the emulated device
		const engine = 0x7f0000001000 // a handle the library never made
		require.NoError(t, Resume(c, engine))
		require.NoError(t, Suspend(c))
		require.NoError(t, Resume(c, 0), "0, the default stream's handle, too")
		require.NoError(t, Suspend(c))
	}
	require.NoError(t, SetStream(c, s))
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 8, -1))
	require.NoError(t, Commit(c, seq(1, 6), false))
	info, err := GetCacheInfo(c)
	require.NoError(t, err)
	assert.Equal(t, int64(6), info.History, "commit advanced the history")
	require.NoError(t, SetStream(c, s2))
	requireCode(t, DestroyStream(m, s2), InvalidState)
	toks, n, err := CommittedTokens(c, 0)
	require.NoError(t, err)
	assert.Equal(t, 6, n)
	assert.Nil(t, toks)
	toks, _, err = CommittedTokens(c, 8)
	require.NoError(t, err)
	assert.Equal(t, seq(1, 6), toks)
	require.NoError(t, CloseCache(c))
	require.NoError(t, DestroyStream(m, s2))
}
