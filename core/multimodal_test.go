package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/internal/testkit/devicetest"
)

// imagePrompt: text block 0..3, then an image item at position 4 (its digest)
// with synthetic tokens 1001..1003, then text 9..12: three full blocks.
func imagePrompt(d blockhash.Digest) ([]config.Token, []blockhash.DigestAt) {
	return []config.Token{0, 1, 2, 3, 0, 1001, 1002, 1003, 9, 10, 11, 12}, []blockhash.DigestAt{{Pos: 4, Digest: d}}
}

// openDigests creates, prefills and commits a cache whose prompt has digest
// tokens, as open does for text.
func (f *fixture) openDigests(prompt []config.Token, digests []blockhash.DigestAt, partialTail bool) *KVCache {
	f.t.Helper()
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, InputDigests: digests})
	require.NoError(f.t, err)
	require.NoError(f.t, c.Resume(f.stream))
	require.NoError(f.t, c.Resize(len(prompt), len(prompt)))
	n := c.NumCommittedTokens()
	require.NoError(f.t, c.CommitDigests(prompt[n:], blockhash.DigestsIn(digests, n, len(prompt)), partialTail))
	return c
}

// A prompt with the same multimodal item at the same position reuses its
// blocks; another item's digest there reuses only the text before it, and
// the value the engine put at a digest position does not matter.
func TestDigestTokensKeyReuse(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	img, other := blockhash.Digest{1, 2, 3}, blockhash.Digest{9}
	prompt, digests := imagePrompt(img)
	require.NoError(t, f.openDigests(prompt, digests, false).Close())

	n, err := f.m.ProbeReuseDigests(blockhash.Scope{}, prompt, digests)
	require.NoError(t, err)
	assert.Equal(t, 12, n, "same item, same place: all of it")
	garbage := append([]config.Token(nil), prompt...)
	garbage[4] = 777
	n, err = f.m.ProbeReuseDigests(blockhash.Scope{}, garbage, digests)
	require.NoError(t, err)
	assert.Equal(t, 12, n, "a digest position's token value is ignored")
	n, err = f.m.ProbeReuseDigests(blockhash.Scope{}, prompt, []blockhash.DigestAt{{Pos: 4, Digest: other}})
	require.NoError(t, err)
	assert.Equal(t, 4, n, "another item: only the text block before it")
	assert.Equal(t, 4, f.m.ProbeReuse(blockhash.Scope{}, prompt), "token 0 is not the item")

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, InputDigests: digests})
	require.NoError(t, err)
	assert.Equal(t, 12, c.ReusedTokens())
	assert.Equal(t, digests, c.CommittedDigests())
	require.NoError(t, c.Close())
}

// Committed digests keep their absolute positions across the tree's full
// blocks and the partial tail, and commits may split a block anywhere.
func TestCommittedDigestsKeepTheirPositions(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	a, b := blockhash.Digest{0xa}, blockhash.Digest{0xb}
	prompt := seq(100, 10)
	digests := []blockhash.DigestAt{{Pos: 2, Digest: a}, {Pos: 5, Digest: b}, {Pos: 9, Digest: a}}
	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(10, 10))
	for _, cut := range [][2]int{{0, 3}, {3, 6}, {6, 10}} {
		require.NoError(t, c.CommitDigests(prompt[cut[0]:cut[1]], blockhash.DigestsIn(digests, cut[0], cut[1]), false))
	}
	assert.Equal(t, digests, c.CommittedDigests())
	toks := c.CommittedTokens()
	for _, d := range digests {
		assert.Zero(t, toks[d.Pos], "a digest position's token is 0")
	}
	require.NoError(t, c.Close())
	keys, err := blockhash.ChainDigests(blockhash.SHA256, blockhash.Scope{}, tpb, prompt, digests, false)
	require.NoError(t, err)
	n, err := f.m.ProbeReuseDigests(blockhash.Scope{}, prompt[:8], digests[:2])
	require.NoError(t, err)
	assert.Equal(t, 8, n)
	k, ok, err := f.m.ProbeFirstNewBlockKeyDigests(blockhash.Scope{}, prompt[:8], digests[:2])
	require.NoError(t, err)
	assert.False(t, ok, "both blocks cached")
	k, ok, err = f.m.ProbeFirstNewBlockKeyDigests(blockhash.Scope{}, append(prompt[:8:8], 1, 2, 3, 4), digests[:2])
	require.NoError(t, err)
	require.True(t, ok)
	more, err := blockhash.ChainDigests(blockhash.SHA256, blockhash.Scope{}, tpb, append(prompt[:8:8], 1, 2, 3, 4), digests[:2], false)
	require.NoError(t, err)
	assert.Equal(t, keys[:2], more[:2])
	assert.Equal(t, more[2], k, "the key the first new block will have")
}

// Partial reuse matches a block's head up to the first token that differs,
// a digest matching only the same digest.
func TestPartialReuseStopsAtAnotherDigest(t *testing.T) {
	cfg := smallConfig(32)
	cfg.EnablePartialReuse = true
	f := newFixture(t, cfg)
	img := blockhash.Digest{7}
	prompt, digests := imagePrompt(img)
	require.NoError(t, f.openDigests(prompt[:8], digests, false).Close())

	n, err := f.m.ProbeReuseDigests(blockhash.Scope{}, append(prompt[:6:6], 5, 5), digests)
	require.NoError(t, err)
	assert.Equal(t, 6, n, "the item and its first synthetic token")
	n, err = f.m.ProbeReuseDigests(blockhash.Scope{}, prompt[:8], []blockhash.DigestAt{{Pos: 4, Digest: blockhash.Digest{8}}})
	require.NoError(t, err)
	assert.Equal(t, 4, n, "another digest matches nothing of the block")
	n, err = f.m.ProbeReuseDigests(blockhash.Scope{}, prompt[:8], nil)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "a text token never matches a digest")
}

// A text-only manager or cache (KVCacheManagerV2's text_only) refuses digest
// tokens, and bad digest positions are refused naming the entry by the C
// ABI's name of the array (input_digest_positions of the cache options,
// digest_positions of the calls); a refused call changes nothing.
func TestDigestTokensAreRefusedWhereTextOnlyOrMisplaced(t *testing.T) {
	f := newFixture(t, smallConfig(32))
	prompt, digests := imagePrompt(blockhash.Digest{1})
	_, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, InputDigests: digests, TextOnly: true})
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "input_digest_positions: digest tokens in a text-only cache")
	_, err = f.m.CreateKVCache(CacheOptions{InputTokens: prompt, InputDigests: []blockhash.DigestAt{{Pos: 12}}})
	assert.ErrorContains(t, err, "input_digest_positions[0]: position 12 outside the 12 tokens")
	_, err = f.m.ProbeReuseDigests(blockhash.Scope{}, prompt, []blockhash.DigestAt{{Pos: 3}, {Pos: 3}})
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "digest_positions[1]: position 3 does not follow 3")

	c, err := f.m.CreateKVCache(CacheOptions{InputTokens: prompt, TextOnly: true})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(12, 12))
	assert.ErrorContains(t, c.CommitDigests(prompt, digests, false), "digest_positions: digest tokens in a text-only cache")
	assert.Zero(t, c.NumCommittedTokens(), "nothing changed")
	require.NoError(t, c.Close())

	cfg := smallConfig(32)
	cfg.TextOnly = true
	g := newFixture(t, cfg)
	_, err = g.m.CreateKVCache(CacheOptions{InputTokens: prompt, InputDigests: digests})
	assert.ErrorContains(t, err, "text-only")
}

// A stored block's event carries its digest tokens, positions in its
// tokens (0 there), so consumers can tell an item from token 0.
func TestStoredEventsCarryDigestTokens(t *testing.T) {
	var events []CacheEvent
	dev := devicetest.Open(t, emu.Options{Seed: 1})
	m, err := NewManager(smallConfig(32), WithDevice(dev), WithEventListener(func(e CacheEvent) { events = append(events, e) }))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		m.Close()
		dev.Close()
	})
	f := &fixture{t: t, m: m, dev: dev, stream: s}
	img := blockhash.Digest{5}
	prompt, digests := imagePrompt(img)
	require.NoError(t, f.openDigests(prompt, digests, false).Close())
	var stored []CacheEvent
	for _, e := range events {
		if e.Kind == BlockStored {
			stored = append(stored, e)
		}
	}
	require.Len(t, stored, 3)
	assert.Nil(t, stored[0].Digests)
	assert.Equal(t, []blockhash.DigestAt{{Pos: 0, Digest: img}}, stored[1].Digests)
	assert.Equal(t, []config.Token{0, 1001, 1002, 1003}, stored[1].Tokens)
	keys, err := blockhash.ChainDigests(blockhash.SHA256, blockhash.Scope{}, tpb, prompt, digests, false)
	require.NoError(t, err)
	assert.Equal(t, keys, []blockhash.Key{stored[0].Key, stored[1].Key, stored[2].Key})
}
