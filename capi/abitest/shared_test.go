package abitest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Shared tier queries through the C ABI: the level, the counters and the
// bounded flush. The cluster tests run against make test's cluster
// (KVCM_REDIS_CLUSTER) and skip without it.

func sharedConfig(addrs, ns string, policy int32) Config {
	cfg := smallConfig(8, 16)
	cfg.Shared = &SharedTier{Addresses: addrs, Namespace: ns, DialTimeoutMs: 200, CallTimeoutMs: 500, WritePolicy: policy}
	return cfg
}

// Without a shared tier the level is KVCM_NO_SHARED_LEVEL, the counters are
// KVCM_ERR_INVALID_STATE and a flush is done at once.
func TestNoSharedTierQueries(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 16), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	l, err := SharedLevel(m)
	require.NoError(t, err)
	assert.Equal(t, NoSharedLevel, l)
	_, err = GetSharedStats(m)
	assert.Equal(t, InvalidState, CodeOf(err), "%v", err)
	assert.Contains(t, err.Error(), "no shared tier")
	done, err := FlushShared(m, 1)
	require.NoError(t, err)
	assert.True(t, done)
}

// The shared level follows the local levels, as events name it; the
// counters of a tier whose cluster is unreachable are readable, and count
// its lookups as errors.
func TestSharedLevelFollowsTheLocalLevels(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(sharedConfig("127.0.0.1:1", "ns", 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	levels, err := NumLevels(m)
	require.NoError(t, err)
	l, err := SharedLevel(m)
	require.NoError(t, err)
	assert.Equal(t, levels, l)
	_, err = ProbeReuse(m, 0, "", seq(0, 8))
	require.NoError(t, err)
	st, err := GetSharedStats(m)
	require.NoError(t, err)
	assert.Equal(t, int64(2), st.LookupBlocks, "two full blocks past the (empty) local tree")
	assert.Zero(t, st.FoundBlocks)
	assert.Positive(t, st.Errors+st.Misses)
	done, err := FlushShared(m, 1000)
	require.NoError(t, err)
	assert.True(t, done, "nothing was written")
}

// A flush timeout that is not positive is an invalid argument naming
// timeout_ms, as is a NULL out; a destroyed manager is an invalid handle.
func TestFlushSharedArguments(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(sharedConfig("127.0.0.1:1", "ns", 0), nil)
	require.NoError(t, err)
	for _, ms := range []int64{0, -1} {
		_, err := FlushShared(m, ms)
		assert.Equal(t, InvalidArgument, CodeOf(err), "%v", err)
		assert.Contains(t, err.Error(), "timeout_ms")
	}
	err = FlushSharedNullOut(m)
	assert.Equal(t, InvalidArgument, CodeOf(err), "%v", err)
	require.NoError(t, DestroyManager(m))
	_, err = FlushShared(m, 1000)
	assert.Equal(t, InvalidHandle, CodeOf(err), "%v", err)
	_, err = GetSharedStats(m)
	assert.Equal(t, InvalidHandle, CodeOf(err), "%v", err)
	_, err = SharedLevel(m)
	assert.Equal(t, InvalidHandle, CodeOf(err), "%v", err)
}

// clusterAddrs returns make test's cluster, or skips.
func clusterAddrs(t *testing.T) string {
	s := os.Getenv("KVCM_REDIS_CLUSTER")
	if s == "" {
		t.Skip("KVCM_REDIS_CLUSTER is not set (scripts/redis-cluster.sh start; make test sets it)")
	}
	return s
}

// Two managers on one cluster (two nodes): what the first writes through
// on commit is written once flush_shared reports it done, and the second
// reuses it whole, onboarding it from the shared level (its events name
// that level as the pages' old level) and counting it in its own stats.
func TestSharedTierAcrossManagers(t *testing.T) {
	noLeaks(t)
	addrs := clusterAddrs(t)
	ns := fmt.Sprintf("abitest%d-%d", os.Getpid(), time.Now().UnixNano())
	prompt := seq(100, 16)

	a, err := CreateManager(sharedConfig(addrs, ns, 1), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(a)) }()
	s, err := CreateStream(a)
	require.NoError(t, err)
	c, err := CreateCache(a, 0, "", prompt)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 16, 16))
	require.NoError(t, Commit(c, prompt, false))
	require.NoError(t, CloseCache(c))
	done, err := FlushShared(a, 30000)
	require.NoError(t, err)
	require.True(t, done)
	sa, err := GetSharedStats(a)
	require.NoError(t, err)
	assert.Equal(t, int64(4), sa.WriteThroughs, "four blocks of one page")
	assert.Equal(t, int64(4), sa.Written+sa.Present)
	assert.Zero(t, sa.WriteErrors+sa.Dropped+sa.LostWrites)

	b, err := CreateManager(sharedConfig(addrs, ns, 1), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(b)) }()
	level, err := SharedLevel(b)
	require.NoError(t, err)
	_, err = DrainBlockEvents(b)
	require.NoError(t, err)
	reuse, err := ProbeReuse(b, 0, "", prompt)
	require.NoError(t, err)
	assert.Equal(t, int64(16), reuse)
	cb, err := CreateCache(b, 0, "", prompt)
	require.NoError(t, err)
	info, err := GetCacheInfo(cb)
	require.NoError(t, err)
	assert.Equal(t, int64(16), info.ReusedToken)
	require.NoError(t, CloseCache(cb))
	sb, err := GetSharedStats(b)
	require.NoError(t, err)
	assert.Equal(t, int64(4), sb.OnboardedBlocks)
	assert.Equal(t, int64(4), sb.OnboardedPages)
	assert.Positive(t, sb.OnboardedBytes)
	assert.Positive(t, sb.BytesRead)
	assert.Zero(t, sb.Corrupt)
	assert.Zero(t, sb.FailedLandings, "every landing was written")
	evs, err := DrainBlockEvents(b)
	require.NoError(t, err)
	onboarded := 0
	for _, e := range evs {
		if e.OldLevel == level {
			assert.Equal(t, int32(1), e.Level, "landed on the host level")
			onboarded++
		}
	}
	assert.Equal(t, 4, onboarded, "one update per onboarded page")
}
