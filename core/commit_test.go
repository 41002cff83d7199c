package core

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device/emu"
)

// storedBlocks runs one cache over prompt, committing it in pieces of the
// given size, and returns the keys and tokens of the blocks it stored.
func storedBlocks(t *testing.T, cfg config.Config, prompt []config.Token, piece int, isEnd bool) (*Manager, []blockhash.Key, [][]config.Token) {
	t.Helper()
	var keys []blockhash.Key
	var toks [][]config.Token
	dev := emu.New(emu.Options{Seed: 1})
	m, err := NewManager(cfg, WithDevice(dev), WithEventListener(func(e CacheEvent) {
		if e.Kind == BlockStored {
			keys = append(keys, e.Key)
			toks = append(toks, e.Tokens)
		}
	}))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		m.Close()
		dev.Close()
	})
	c, err := m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, c.Resume(s))
	require.NoError(t, c.Resize(len(prompt), len(prompt)))
	mine := slices.Clone(prompt) // the caller's buffer, reused after each call
	for pos := 0; pos < len(prompt); pos += piece {
		end := min(pos+piece, len(prompt))
		require.NoError(t, c.Commit(mine[pos:end], isEnd && end == len(prompt)))
		clear(mine[pos:end])
		assert.Equal(t, end, c.NumCommittedTokens())
	}
	require.NoError(t, c.Close())
	return m, keys, toks
}

// Committing a prompt in pieces of any size publishes exactly its full
// blocks, with their own copy of the tokens, as committing it at once does.
func TestCommitInPiecesPublishesEveryFullBlock(t *testing.T) {
	prompt := seq(0, 26)
	want := blockhash.Chain(blockhash.Scope{}, tpb, prompt)
	for _, piece := range []int{1, 3, 4, 5, 7, 26} {
		t.Run(fmt.Sprintf("piece=%d", piece), func(t *testing.T) {
			m, keys, toks := storedBlocks(t, smallConfig(16), prompt, piece, false)
			assert.Equal(t, want, keys)
			require.Len(t, toks, len(want))
			for b, blk := range toks {
				assert.Equal(t, prompt[b*tpb:(b+1)*tpb], blk, "block %d keeps its tokens after the caller reuses its buffer", b)
			}
			assert.Equal(t, 24, m.ProbeReuse(blockhash.Scope{}, prompt))
		})
	}
}

// With partial reuse, the tokens of the trailing partial block committed in
// pieces are published at close and reusable, whether or not the last commit
// said isEnd: closing stops the commits, and KVCacheManagerV2 commits the
// partial block when commits stop.
func TestCommitInPiecesPublishesThePartialTail(t *testing.T) {
	cfg := smallConfig(16)
	cfg.EnablePartialReuse = true
	prompt := seq(0, 26)
	for _, isEnd := range []bool{true, false} {
		for _, piece := range []int{1, 3, 26} {
			t.Run(fmt.Sprintf("isEnd=%v/piece=%d", isEnd, piece), func(t *testing.T) {
				m, keys, toks := storedBlocks(t, cfg, prompt, piece, isEnd)
				require.Len(t, keys, 7, "six full blocks and the partial one")
				assert.Equal(t, prompt[24:], toks[6])
				assert.Equal(t, 26, m.ProbeReuse(blockhash.Scope{}, append(slices.Clone(prompt), 99)))
			})
		}
	}
}

// StopCommitting stops the commits as a commit with isEnd does: with partial
// reuse the committed tokens' trailing partial block is published at the
// stop, as KVCacheManagerV2 commits it, and tokens after the stop are not.
func TestStopCommittingPublishesThePartialTailAtTheStop(t *testing.T) {
	cfg := smallConfig(16)
	cfg.EnablePartialReuse = true
	f := newFixture(t, cfg)
	m, s := f.m, f.stream
	prompt := seq(0, 10)
	c, err := m.CreateKVCache(CacheOptions{InputTokens: prompt})
	require.NoError(t, err)
	require.NoError(t, c.Resume(s))
	require.NoError(t, c.Resize(12, 0))
	require.NoError(t, c.Commit(prompt, false))
	c.StopCommitting()
	require.Error(t, c.Commit(seq(10, 2), false), "no commit after the stop")
	assert.Equal(t, 10, m.ProbeReuse(blockhash.Scope{}, append(slices.Clone(prompt), 99)), "published at the stop")
	require.NoError(t, c.Close())
	assert.Equal(t, 10, m.ProbeReuse(blockhash.Scope{}, append(slices.Clone(prompt), 99)))
}

// A decode step within the last block checks what any Resize and Commit
// check: a history that would decrease, a capacity below the history, tokens
// past the capacity, a commit after stop_committing and a suspended cache
// fail and change nothing; a valid step goes through.
func TestDecodeStepInBlockChecksItsArguments(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	c := f.open(blockhash.Scope{}, seq(0, 5)) // 1 token into its second block
	require.NoError(t, c.Resize(6, 5))
	err := c.Resize(6, 4)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "history_length")
	err = c.Resize(5, 6)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "capacity")
	err = c.Commit(seq(5, 2), false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "tokens")
	assert.Equal(t, []int{6, 5, 5}, []int{c.Capacity(), c.HistoryLength(), c.NumCommittedTokens()})

	require.NoError(t, c.Commit(seq(5, 1), false))
	assert.Equal(t, []int{6, 6, 6}, []int{c.Capacity(), c.HistoryLength(), c.NumCommittedTokens()})
	c.StopCommitting()
	require.NoError(t, c.Resize(7, 6))
	require.ErrorIs(t, c.Commit(seq(6, 1), false), ErrInvalidState)
	require.NoError(t, c.Suspend())
	require.ErrorIs(t, c.Resize(7, 7), ErrInvalidState)
	assert.Equal(t, []int{7, 6, 6}, []int{c.Capacity(), c.HistoryLength(), c.NumCommittedTokens()})
	require.NoError(t, c.Close())
}
