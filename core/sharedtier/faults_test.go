package sharedtier

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Faults are misses and counted errors, never wrong bytes and never a hang.
// Each test runs its own cluster (ports 72xx), since it stops or fills nodes.

// checkNoWrongBytes asserts that every blob returned is its key's.
func checkNoWrongBytes(t *testing.T, keys []Key, blobs [][]byte, size int) (hits int) {
	t.Helper()
	for i, b := range blobs {
		if b != nil {
			require.Equal(t, blob(keys[i], size), b, "blob %d", i)
			hits++
		}
	}
	return hits
}

// A master stopped in the middle of a run: its keys are misses and counted
// errors, the other masters' keys are still hits, every call returns; after
// the node restarts the store reaches it again on its own.
func TestNodeDownIsAMissAndRecovers(t *testing.T) {
	c := startPrivateCluster(t, 7201, "64mb")
	const size = 16 << 10
	s := open(t, Options{Addresses: c.seed, Namespace: namespace(t), BatchKeys: 16,
		CallTimeout: 500 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	keys := chain(21, 60)
	putAll(t, s, keys, size)
	ctx := context.Background()

	c.run("stop-node", "1")
	blobs, err := s.Get(ctx, keys)
	require.Error(t, err)
	hits := checkNoWrongBytes(t, keys, blobs, size)
	assert.Positive(t, hits, "the other masters still serve their keys")
	assert.Less(t, hits, len(keys), "the stopped master's keys are misses")
	assert.Positive(t, s.Stats().Errors)
	_, err = s.MatchPrefix(ctx, keys)
	require.Error(t, err)
	for _, k := range keys {
		s.Put(k, blob(k, size)) // never blocks; writes to the stopped node fail and are counted
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	require.NoError(t, s.Flush(fctx))
	cancel()
	assert.Positive(t, s.Stats().WriteErrors)

	c.run("start-node", "1") // back empty (no persistence), owning its slots again
	const tries = 100
	for i := range tries {
		for _, k := range keys {
			s.Put(k, blob(k, size))
		}
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		require.NoError(t, s.Flush(fctx))
		cancel()
		blobs, err = s.Get(ctx, keys)
		if err == nil && checkNoWrongBytes(t, keys, blobs, size) == len(keys) {
			return
		}
		require.Less(t, i, tries-1, "the store did not recover after the node restarted: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
}

// A node that stops answering (CLIENT PAUSE) makes calls end at CallTimeout
// as misses counted as timeouts.
func TestUnresponsiveNodeTimesOut(t *testing.T) {
	c := startPrivateCluster(t, 7201, "64mb")
	const size = 1024
	s := open(t, Options{Addresses: c.seed, Namespace: namespace(t), CallTimeout: 300 * time.Millisecond})
	keys := chain(22, 30)
	putAll(t, s, keys, size)
	c.cli(7201, "client", "pause", "3000", "all")
	blobs, err := s.Get(context.Background(), keys)
	require.Error(t, err)
	hits := checkNoWrongBytes(t, keys, blobs, size)
	assert.Less(t, hits, len(keys))
	assert.Positive(t, s.Stats().Timeouts)
	c.cli(7202, "ping") // the other nodes answer meanwhile
}

// Slots moved between masters (resharding) are followed through MOVED/ASK:
// reads during the migration never return wrong bytes, and after it every
// key is a hit again.
func TestReshardingIsFollowed(t *testing.T) {
	c := startPrivateCluster(t, 7201, "64mb")
	const size = 4096
	s := open(t, Options{Addresses: c.seed, Namespace: namespace(t)})
	keys := chain(23, 200)
	putAll(t, s, keys, size)
	from := nodeID(t, c, 7201)
	to := nodeID(t, c, 7202)
	// Reads during the migration (MOVED and ASK) may miss, never return
	// wrong bytes.
	done := make(chan struct{})
	reads := make(chan [][]byte, 1000)
	go func() {
		defer close(reads)
		for range cap(reads) {
			select {
			case <-done:
				return
			default:
			}
			b, _ := s.Get(context.Background(), keys)
			reads <- b
		}
	}()
	out, err := runTimeout(60, "redis-cli", "--cluster", "reshard", "127.0.0.1:7201", "--cluster-from", from,
		"--cluster-to", to, "--cluster-slots", "500", "--cluster-yes")
	close(done)
	require.NoError(t, err, "reshard: %s", out)
	for b := range reads {
		checkNoWrongBytes(t, keys, b, size)
	}
	blobs, err := s.Get(context.Background(), keys)
	require.NoError(t, err)
	require.Equal(t, len(keys), checkNoWrongBytes(t, keys, blobs, size))
	n, err := s.MatchPrefix(context.Background(), keys)
	require.NoError(t, err)
	assert.Equal(t, len(keys), n)
}

func nodeID(t *testing.T, c *privateCluster, port int) string {
	id := strings.TrimSpace(c.cli(port, "cluster", "myid"))
	require.Len(t, id, 40, "cluster myid on %d", port)
	return id
}

// A cluster that evicts (maxmemory, allkeys-lru) loses blobs: they are
// misses, and what is returned is right.
func TestEvictingClusterIsAMiss(t *testing.T) {
	c := startPrivateCluster(t, 7201, "4mb")
	const size = 256 << 10
	s := open(t, Options{Addresses: c.seed, Namespace: namespace(t), Verify: verifyBlob(size)})
	keys := chain(24, 80) // 20 MiB into 12 MiB
	putAll(t, s, keys, size)
	evicted := 0
	for _, p := range []int{7201, 7202, 7203} {
		for _, l := range strings.Split(c.cli(p, "info", "stats"), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "evicted_keys:"); ok {
				n, err := strconv.Atoi(v)
				require.NoError(t, err)
				evicted += n
			}
		}
	}
	require.Positive(t, evicted, "the cluster should have evicted keys")
	blobs, err := s.Get(context.Background(), keys)
	require.NoError(t, err, "an evicted key is a plain miss")
	hits := checkNoWrongBytes(t, keys, blobs, size)
	assert.Less(t, hits, len(keys))
	assert.Zero(t, s.Stats().Corrupt)
	n, err := s.MatchPrefix(context.Background(), keys)
	require.NoError(t, err)
	assert.Less(t, n, len(keys))
}

func runTimeout(seconds int, name string, args ...string) (string, error) {
	out, err := execCommand("timeout", append([]string{fmt.Sprint(seconds), name}, args...)...)
	return out, err
}
