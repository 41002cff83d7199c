package sharedtier

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func open(t *testing.T, o Options) *Store {
	t.Helper()
	s, err := Open(o)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func putAll(t *testing.T, s *Store, keys []Key, size int) {
	t.Helper()
	for _, k := range keys {
		require.True(t, s.Put(k, blob(k, size)), "Put(%v)", k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, s.Flush(ctx))
}

// Options.Validate names the field at fault.
func TestOptionsErrorsNameTheField(t *testing.T) {
	good := Options{Addresses: []string{"127.0.0.1:7101"}, Namespace: "ns"}
	for _, tc := range []struct {
		field string
		edit  func(*Options)
	}{
		{"addresses", func(o *Options) { o.Addresses = nil }},
		{"addresses[1]", func(o *Options) { o.Addresses = append(o.Addresses, "nohost") }},
		{"addresses[0]", func(o *Options) { o.Addresses = []string{"127.0.0.1:0"} }},
		{"namespace", func(o *Options) { o.Namespace = "" }},
		{"namespace", func(o *Options) { o.Namespace = "a{b}" }},
		{"namespace", func(o *Options) { o.Namespace = "a:b" }},
		{"ttl", func(o *Options) { o.TTL = -time.Second }},
		{"ttl", func(o *Options) { o.TTL = time.Microsecond }},
		{"call_timeout", func(o *Options) { o.CallTimeout = -1 }},
		{"queue_bytes", func(o *Options) { o.QueueBytes = -1 }},
	} {
		o := good
		o.Addresses = append([]string(nil), good.Addresses...)
		tc.edit(&o)
		err := o.Validate()
		require.Error(t, err, tc.field)
		assert.True(t, strings.HasPrefix(err.Error(), tc.field+":"), "%q should name %s", err, tc.field)
	}
	require.NoError(t, good.Validate())
}

// What Put wrote, Get returns to the byte, and MatchPrefix counts it; a key
// never written is a miss.
func TestStoreRoundTrip(t *testing.T) {
	addrs := sharedCluster(t)
	const size = 64 << 10
	s := open(t, Options{Addresses: addrs, Namespace: namespace(t), BatchKeys: 8, Verify: verifyBlob(size)})
	keys := chain(7, 50) // several batches, every slot owner
	putAll(t, s, keys, size)

	ctx := context.Background()
	n, err := s.MatchPrefix(ctx, keys)
	require.NoError(t, err)
	assert.Equal(t, len(keys), n)

	missing := Key{Fingerprint: fingerprint(7), Lifecycle: 0, Block: 1}
	blobs, err := s.Get(ctx, append(keys, missing))
	require.NoError(t, err)
	for i, k := range keys {
		assert.Equal(t, blob(k, size), blobs[i], "blob %d", i)
	}
	assert.Nil(t, blobs[len(keys)], "a key never written is a miss")
	st := s.Stats()
	assert.EqualValues(t, len(keys), st.Written)
	assert.EqualValues(t, int64(len(keys))*size, st.BytesWritten)
	assert.Zero(t, st.Errors)
	assert.EqualValues(t, 1, st.Misses)
}

// MatchPrefix ends at the first key the tier lacks, also inside a batch and
// past the first batch.
func TestMatchPrefixEndsAtTheFirstMiss(t *testing.T) {
	addrs := sharedCluster(t)
	s := open(t, Options{Addresses: addrs, Namespace: namespace(t), BatchKeys: 4, LookupBatchKeys: 4})
	keys := chain(9, 20)
	putAll(t, s, keys[:11], 1024)
	putAll(t, s, keys[12:], 1024)
	n, err := s.MatchPrefix(context.Background(), keys)
	require.NoError(t, err)
	assert.Equal(t, 11, n)
	n, err = s.MatchPrefix(context.Background(), keys[12:])
	require.NoError(t, err)
	assert.Equal(t, 8, n)
}

// The layout fingerprint and the lifecycle are part of the address: the same
// block key under another fingerprint or lifecycle is another blob.
func TestKeysAreContentAddressed(t *testing.T) {
	addrs := sharedCluster(t)
	s := open(t, Options{Addresses: addrs, Namespace: namespace(t)})
	k := Key{Fingerprint: fingerprint(1), Lifecycle: 0, Block: 42}
	putAll(t, s, []Key{k}, 100)
	other := []Key{{Fingerprint: fingerprint(2), Lifecycle: 0, Block: 42}, {Fingerprint: fingerprint(1), Lifecycle: 1, Block: 42}}
	blobs, err := s.Get(context.Background(), other)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{nil, nil}, blobs)
	o := open(t, Options{Addresses: addrs, Namespace: namespace(t)})
	n, err := o.MatchPrefix(context.Background(), []Key{k})
	require.NoError(t, err)
	assert.Zero(t, n, "another namespace does not see the blob")
}

// A key already in the cluster is not written again, nor is one already
// queued.
func TestPutSkipsKeysAlreadyPresent(t *testing.T) {
	addrs := sharedCluster(t)
	s := open(t, Options{Addresses: addrs, Namespace: namespace(t)})
	keys := chain(3, 4)
	putAll(t, s, keys, 4096)
	putAll(t, s, keys, 4096)
	st := s.Stats()
	assert.EqualValues(t, 4, st.Written)
	assert.EqualValues(t, 4, st.Present)
}

// A writer's round trip writes one batch and asks EXISTS of the next: over
// many batches, with present and missing keys interleaved, every missing key
// is written once, every present one is skipped (counted, not sent), and
// every blob reads back to the byte, with one writer and with several.
func TestWritesSkipPresentKeysAcrossBatches(t *testing.T) {
	addrs := sharedCluster(t)
	const size = 2048
	for _, writers := range []int{1, 3} {
		ns := namespace(t)
		keys := chain(13, 61)
		var present []Key
		for i, k := range keys {
			if i%3 == 1 || (i >= 20 && i < 30) {
				present = append(present, k)
			}
		}
		other := open(t, Options{Addresses: addrs, Namespace: ns})
		putAll(t, other, present, size)
		s := open(t, Options{Addresses: addrs, Namespace: ns, BatchKeys: 4, Writers: writers, Verify: verifyBlob(size)})
		putAll(t, s, keys, size)
		st := s.Stats()
		assert.EqualValues(t, len(keys)-len(present), st.Written, "writers %d", writers)
		assert.EqualValues(t, len(present), st.Present, "writers %d", writers)
		assert.EqualValues(t, int64(len(keys)-len(present))*size, st.BytesWritten, "writers %d", writers)
		assert.Zero(t, st.WriteErrors, "writers %d", writers)
		blobs, err := s.Get(context.Background(), keys)
		require.NoError(t, err)
		for i, k := range keys {
			assert.Equal(t, blob(k, size), blobs[i], "writers %d, blob %d", writers, i)
		}
	}
}

// Verify rejecting a blob (a checksum mismatch, a foreign header) makes it a
// miss and a counted error, never bytes handed out.
func TestVerifyRejectionIsAMiss(t *testing.T) {
	addrs := sharedCluster(t)
	ns := namespace(t)
	w := open(t, Options{Addresses: addrs, Namespace: ns})
	keys := chain(5, 3)
	putAll(t, w, keys, 2048)
	bad := keys[1]
	r := open(t, Options{Addresses: addrs, Namespace: ns, Verify: func(k Key, b []byte) error {
		if k == bad {
			return assert.AnError
		}
		return verifyBlob(2048)(k, b)
	}})
	blobs, err := r.Get(context.Background(), keys)
	require.ErrorIs(t, err, assert.AnError)
	assert.Equal(t, blob(keys[0], 2048), blobs[0])
	assert.Nil(t, blobs[1])
	assert.Equal(t, blob(keys[2], 2048), blobs[2])
	assert.EqualValues(t, 1, r.Stats().Corrupt)
}

// Get's batches are in flight together (GetDepth), yet the error it reports
// is the first in key order, and every other blob is still returned.
func TestGetReportsTheFirstErrorInKeyOrder(t *testing.T) {
	addrs := sharedCluster(t)
	ns := namespace(t)
	w := open(t, Options{Addresses: addrs, Namespace: ns})
	keys := chain(6, 4*GetDepth)
	putAll(t, w, keys, 1024)
	early, late := errors.New("early key"), errors.New("late key")
	r := open(t, Options{Addresses: addrs, Namespace: ns, BatchKeys: 2, Verify: func(k Key, b []byte) error {
		switch k {
		case keys[1]:
			return early
		case keys[len(keys)-1]:
			return late
		}
		return verifyBlob(1024)(k, b)
	}})
	blobs, err := r.Get(context.Background(), keys)
	require.ErrorIs(t, err, early)
	for i, k := range keys {
		if i == 1 || i == len(keys)-1 {
			assert.Nil(t, blobs[i])
			continue
		}
		assert.Equal(t, blob(k, 1024), blobs[i], "blob %d", i)
	}
	assert.EqualValues(t, 2, r.Stats().Corrupt)
}

// Every blob is written with the configured TTL.
func TestPutSetsTheTTL(t *testing.T) {
	addrs := sharedCluster(t)
	s := open(t, Options{Addresses: addrs, Namespace: namespace(t), TTL: time.Hour})
	k := Key{Fingerprint: fingerprint(1), Block: 2}
	putAll(t, s, []Key{k}, 10)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	require.NoError(t, err)
	defer c.Close()
	ttl, err := c.Do(context.Background(), c.B().Pttl().Key(s.KeyName(k)).Build()).AsInt64()
	require.NoError(t, err)
	assert.Greater(t, ttl, int64(0))
	assert.LessOrEqual(t, ttl, time.Hour.Milliseconds())
}

// Put never blocks: with the cluster unreachable and the queue full, it
// drops and counts; lookups are misses and counted errors.
func TestUnreachableClusterDropsAndMisses(t *testing.T) {
	// A loopback port nothing listens on (the discard port).
	s := open(t, Options{Addresses: []string{"127.0.0.1:9"}, Namespace: "unreachable",
		QueueBlobs: 2, Writers: 1, DialTimeout: 100 * time.Millisecond, CallTimeout: 100 * time.Millisecond})
	keys := chain(1, 100)
	accepted := 0
	for _, k := range keys {
		if s.Put(k, blob(k, 128)) {
			accepted++
		}
	}
	st := s.Stats()
	// How many the writer takes off the queue meanwhile depends on timing;
	// what does not is that every Put not queued was counted.
	assert.Less(t, accepted, len(keys), "a full queue drops")
	assert.EqualValues(t, len(keys)-accepted, st.Dropped+st.Deduplicated, "every Put is queued or counted")
	n, err := s.MatchPrefix(context.Background(), keys)
	assert.Error(t, err)
	assert.Zero(t, n)
	blobs, err := s.Get(context.Background(), keys[:3])
	assert.Error(t, err)
	assert.Equal(t, [][]byte{nil, nil, nil}, blobs)
	assert.Positive(t, s.Stats().Errors)
}

// A full queue in bytes drops too.
func TestQueueBytesBoundPuts(t *testing.T) {
	s := open(t, Options{Addresses: []string{"127.0.0.1:9"}, Namespace: "bytes", QueueBytes: 1000,
		DialTimeout: 100 * time.Millisecond, CallTimeout: 100 * time.Millisecond})
	assert.False(t, s.Put(Key{Block: 1}, make([]byte, 1001)))
	assert.EqualValues(t, 1, s.Stats().Dropped)
}

const childEnv = "KVCM_SHAREDTIER_CHILD_NAMESPACE"

// Two processes (two nodes) share blobs: a child process writes a chain, and
// this one reads it back to the byte.
func TestTwoProcessesShareBlobs(t *testing.T) {
	addrs := sharedCluster(t)
	if ns := os.Getenv(childEnv); ns != "" {
		return // the child's part runs in TestChildWrites
	}
	ns := namespace(t)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestChildWrites$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+ns)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child: %s", out)
	require.Contains(t, string(out), "PASS")

	const size = 32 << 10
	s := open(t, Options{Addresses: addrs, Namespace: ns, Verify: verifyBlob(size)})
	keys := chain(11, 40)
	n, err := s.MatchPrefix(context.Background(), keys)
	require.NoError(t, err)
	require.Equal(t, len(keys), n)
	blobs, err := s.Get(context.Background(), keys)
	require.NoError(t, err)
	for i, k := range keys {
		require.Equal(t, blob(k, size), blobs[i])
	}
	putAll(t, s, keys, size)
	assert.EqualValues(t, len(keys), s.Stats().Present, "what the other node wrote is not written again")
}

// TestChildWrites is TestTwoProcessesShareBlobs's child: it writes the chain
// and exits.
func TestChildWrites(t *testing.T) {
	ns := os.Getenv(childEnv)
	if ns == "" {
		t.Skip("the child of TestTwoProcessesShareBlobs")
	}
	s := open(t, Options{Addresses: sharedCluster(t), Namespace: ns})
	putAll(t, s, chain(11, 40), 32<<10)
	require.EqualValues(t, 40, s.Stats().Written)
}
