package layout_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// A sliding window of w tokens keeps, after history computed tokens, the
// blocks from position history+1-w on: the token at the first uncomputed
// position attends to w tokens ending at itself (KVCacheManagerV2's stale
// range ends at block (history+1-w)/tokens_per_block).
func TestFirstKeptBlockIsTheNextTokensWindow(t *testing.T) {
	cfg := &config.Config{
		TokensPerBlock: 4,
		CacheTiers:     []config.CacheTierConfig{config.GPU(1)},
		Layers: []config.AttentionLayerConfig{
			{LayerID: 0, SlidingWindowSize: 8, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 64}}},
		},
	}
	lt := layout.New(cfg)
	for history, want := range map[int]int{0: 0, 7: 0, 8: 0, 10: 0, 11: 1, 12: 1, 14: 1, 15: 2, 27: 5} {
		assert.Equal(t, want, lt.FirstKeptBlock(0, history), "history %d", history)
		assert.True(t, lt.Needs(0, want, history), "history %d: block %d is needed", history, want)
		if want > 0 {
			assert.False(t, lt.Needs(0, want-1, history), "history %d: block %d is stale", history, want-1)
		}
	}
}
