package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/layout"
)

// A block a cache computes again while an equal block sits on a colder
// level, referenced by no cache, replaces that cold copy: the tree then holds
// the cache's page, on the GPU, and the cold slot is freed.
func TestARecomputedBlockReplacesItsUnusedColdCopy(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0))
	require.NoError(t, f.compute(blockhash.Scope{}, seq(0, 16), 1).Close())
	require.NoError(t, f.compute(blockhash.Scope{}, seq(500, 16), 2).Close())
	require.Equal(t, int64(4), levelOf(t, f.m, 1).Evictable, "the first prompt's 4 blocks went to host")

	// Computed again without reusing them (an engine that chose to
	// recompute rather than read back).
	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(16, 0))
	f.writeAll(c, 3)
	require.NoError(t, c.Commit(seq(0, 16), false))
	require.NoError(t, c.Close())

	host := levelOf(t, f.m, 1)
	assert.Equal(t, int64(4), host.Evictable, "host keeps the second prompt's blocks only")
	onboarded := f.m.MigrationStats()[HostToHot].Pages
	d := f.open(blockhash.Scope{}, seq(0, 16))
	assert.Equal(t, 16, d.ReusedTokens())
	assert.Equal(t, onboarded, f.m.MigrationStats()[HostToHot].Pages, "reused from the GPU, nothing onboarded")
	assert.Equal(t, 16, f.verifyAll(d, 3), "the recomputed pages, 4 blocks × 4 buffers")
	require.NoError(t, d.Close())
	st, err := f.m.StorageStats(layout.GPULevel)
	require.NoError(t, err)
	assert.Equal(t, int64(4), st[0].Evictable)
}

// A cold copy that a suspended cache holds is not replaced: the recomputing
// cache keeps its page private.
func TestAHeldColdCopyIsNotReplaced(t *testing.T) {
	f := newTieredFixture(t, tieredConfig(t, 4, 8, 0))
	a := f.compute(blockhash.Scope{}, seq(0, 16), 1)
	require.NoError(t, a.Suspend())
	require.NoError(t, f.compute(blockhash.Scope{}, seq(500, 16), 2).Close())

	c, err := f.m.CreateKVCache(CacheOptions{})
	require.NoError(t, err)
	require.NoError(t, c.Resume(f.stream))
	require.NoError(t, c.Resize(16, 0))
	f.writeAll(c, 3)
	require.NoError(t, c.Commit(seq(0, 16), false))
	require.NoError(t, c.Close())

	require.NoError(t, a.Resume(f.stream))
	assert.Equal(t, 16, f.verifyAll(a, 1), "the suspended cache's own data came back")
	require.NoError(t, a.Close())
}
