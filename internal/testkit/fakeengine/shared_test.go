package fakeengine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// The shared tier's contract with engines, against a real Redis Cluster on
// loopback (make test starts one and exports its seeds in
// KVCM_REDIS_CLUSTER; without it these tests skip): a second manager — in
// this process or another — reuses the blocks a first one wrote, to the
// byte; a cluster node stopped mid-run gives misses, never errors to the
// engine.

const clusterEnv = "KVCM_REDIS_CLUSTER"

func clusterSeeds(t *testing.T) []string {
	t.Helper()
	s := os.Getenv(clusterEnv)
	if s == "" {
		t.Skipf("%s is not set: run under make test, or scripts/redis-cluster.sh start and export %s=$(scripts/redis-cluster.sh addrs)",
			clusterEnv, clusterEnv)
	}
	addrs := strings.Split(s, ",")
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		require.NoError(t, err, "%s: %q", clusterEnv, a)
		ip := net.ParseIP(host)
		require.True(t, ip != nil && ip.IsLoopback(), "%s: %q is not a loopback address", clusterEnv, a)
	}
	return addrs
}

var nsSeq atomic.Int64

// uniqueNamespace keeps tests and runs sharing a cluster apart.
func uniqueNamespace() string {
	return fmt.Sprintf("fe%d-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9, nsSeq.Add(1))
}

// sharedSetup is the default rig with a host tier of hostSlots pages and the
// shared tier.
func sharedSetup(seeds []string, ns string, policy config.SharedWritePolicy, hostSlots, gpuSlots int64) setup {
	return setup{hostSlots: hostSlots, slots: gpuSlots, engine: fakeengine.Options{ChunkTokens: 48},
		tweak: func(c *config.Config) {
			c.CacheTiers = append(c.CacheTiers, config.Shared(config.SharedCacheTierConfig{
				Addresses: seeds, Namespace: ns, WritePolicy: policy, CallTimeout: 500 * time.Millisecond,
				DialTimeout: 500 * time.Millisecond,
			}))
		}}
}

func flush(t *testing.T, m *core.Manager) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, m.FlushShared(ctx))
}

func sharedStats(t *testing.T, m *core.Manager) core.SharedStats {
	t.Helper()
	st, ok := m.SharedStats()
	require.True(t, ok)
	return st
}

// Under write-through a second manager reuses every full block of a prefix
// the first committed, onboarded shared → host → GPU, and the fake engine
// verifies every reused byte.
func TestSecondManagerReusesFirstsBlocksWrittenThrough(t *testing.T) {
	seeds, ns := clusterSeeds(t), uniqueNamespace()
	s := sharedSetup(seeds, ns, config.WriteThroughOnCommit, 256, 0)
	a, b := newRig(t, s), newRig(t, s)
	rng := rand.New(rand.NewPCG(15, 1))
	system := randTokens(rng, 150)

	first, err := a.e.Serve(a.stream(), fakeengine.Request{Prompt: concat(system, randTokens(rng, 50)), OutputLen: 10})
	require.NoError(t, err)
	assert.Zero(t, first.Reused)
	flush(t, a.m)
	assert.Positive(t, sharedStats(t, a.m).Store.Written)

	assert.Equal(t, 144, b.m.ProbeReuse(blockhash.Scope{}, concat(system, randTokens(rng, 40))), "probe_reuse sees the shared blocks")
	second, err := b.e.Serve(b.stream(), fakeengine.Request{Prompt: concat(system, randTokens(rng, 40)), OutputLen: 5})
	require.NoError(t, err)
	assert.Equal(t, 144, second.Reused, "9 full blocks of the shared 150 tokens")
	assert.Zero(t, second.Verified.Mismatches)
	assert.Equal(t, int64(9), second.Verified.PagesVerified)
	assert.Zero(t, second.Final.Mismatches)
	st := sharedStats(t, b.m)
	assert.Equal(t, int64(9), st.OnboardedBlocks)
	assert.Zero(t, st.Store.Errors)
	assert.Zero(t, st.Store.Corrupt)
	b.requireDrained()
}

// Under write-back (the default) a block reaches the cluster when eviction
// drops it from the last local level, and only then; another manager then
// reuses it, verified to the byte.
func TestEvictedBlocksAreWrittenBackAndReused(t *testing.T) {
	seeds, ns := clusterSeeds(t), uniqueNamespace()
	s := sharedSetup(seeds, ns, config.WriteBackOnEviction, 16, 16)
	a, b := newRig(t, s), newRig(t, s)
	rng := rand.New(rand.NewPCG(15, 2))
	system := randTokens(rng, 160)

	_, err := a.e.Serve(a.stream(), fakeengine.Request{Prompt: system, OutputLen: 1})
	require.NoError(t, err)
	flush(t, a.m)
	require.Zero(t, sharedStats(t, a.m).WriteBacks, "nothing is written while the local levels keep it")
	for range 4 { // 4 × 10 blocks through 16 GPU and 16 host pages
		_, err := a.e.Serve(a.stream(), fakeengine.Request{Prompt: randTokens(rng, 160), OutputLen: 1})
		require.NoError(t, err)
	}
	flush(t, a.m)
	st := sharedStats(t, a.m)
	require.Positive(t, st.WriteBacks)
	assert.Equal(t, st.WriteBacks, st.Store.Written+st.Store.Present+st.Store.Deduplicated)
	assert.Equal(t, 160, a.m.ProbeReuse(blockhash.Scope{}, system), "the evicted system prompt is found in the shared tier")

	second, err := b.e.Serve(b.stream(), fakeengine.Request{Prompt: concat(system, randTokens(rng, 20)), OutputLen: 2})
	require.NoError(t, err)
	assert.Equal(t, 160, second.Reused)
	assert.Zero(t, second.Verified.Mismatches)
	assert.Equal(t, int64(10), second.Verified.PagesVerified)
	assert.Zero(t, b.e.Mismatches())
}

const helperEnv = "KVCM_SHARED_HELPER_NAMESPACE"

// helperPrompt is the prompt both processes derive from the namespace.
func helperPrompt(ns string) []config.Token {
	var seed uint64
	for _, c := range ns {
		seed = seed*131 + uint64(c)
	}
	return randTokens(rand.New(rand.NewPCG(seed, 15)), 128)
}

// TestSharedTierHelperProcess is the first node of
// TestSecondProcessReusesFirstsBlocks: it runs only as that test's helper
// process, serves the prompt with write-through, flushes and exits.
func TestSharedTierHelperProcess(t *testing.T) {
	ns := os.Getenv(helperEnv)
	if ns == "" {
		t.Skip("the helper process of TestSecondProcessReusesFirstsBlocks")
	}
	a := newRig(t, sharedSetup(clusterSeeds(t), ns, config.WriteThroughOnCommit, 64, 0))
	res, err := a.e.Serve(a.stream(), fakeengine.Request{Prompt: helperPrompt(ns), OutputLen: 4})
	require.NoError(t, err)
	require.Zero(t, res.Reused)
	flush(t, a.m)
	require.Equal(t, int64(8), sharedStats(t, a.m).Store.Written, "8 blocks of 16 tokens")
}

// Two processes are two nodes: the blocks one process committed are reused,
// to the byte, by a manager in another.
func TestSecondProcessReusesFirstsBlocks(t *testing.T) {
	seeds, ns := clusterSeeds(t), uniqueNamespace()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSharedTierHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+ns)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "helper process:\n%s", out)
	require.NotContains(t, string(out), "SKIP", "the helper ran")

	b := newRig(t, sharedSetup(seeds, ns, config.WriteBackOnEviction, 64, 0))
	res, err := b.e.Serve(b.stream(), fakeengine.Request{Prompt: concat(helperPrompt(ns), []config.Token{7, 8, 9}), OutputLen: 2})
	require.NoError(t, err)
	assert.Equal(t, 128, res.Reused)
	assert.Zero(t, res.Verified.Mismatches)
	assert.Equal(t, int64(8), res.Verified.PagesVerified)
	assert.Equal(t, int64(8), sharedStats(t, b.m).OnboardedBlocks)
}

func clusterScript() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "scripts", "redis-cluster.sh")
}

// privateCluster starts a cluster of this test alone on basePort..+2 and
// stops it at cleanup; run runs the script's other commands on it.
func privateCluster(t *testing.T, basePort int) (seeds []string, run func(args ...string)) {
	t.Helper()
	clusterSeeds(t) // runs where make test runs the cluster tests
	env := append(os.Environ(), "KVCM_REDIS_BASE_PORT="+strconv.Itoa(basePort),
		"KVCM_REDIS_DIR="+filepath.Join(os.TempDir(), fmt.Sprintf("kvcm-redis-cluster-fe-%d", basePort)))
	run = func(args ...string) {
		t.Helper()
		cmd := exec.Command("bash", append([]string{clusterScript()}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "redis-cluster.sh %v:\n%s", args, out)
	}
	run("stop")
	t.Cleanup(func() { run("stop") })
	run("start")
	for i := range 3 {
		seeds = append(seeds, fmt.Sprintf("127.0.0.1:%d", basePort+i))
	}
	return seeds, run
}

// A node stopped in the middle of a run costs misses and counted errors,
// never an error to the engine nor a wrong byte; the blocks on the nodes
// still up are reused.
func TestStoppedNodeGivesMissesNotErrors(t *testing.T) {
	seeds, run := privateCluster(t, 7441)
	s := sharedSetup(seeds, uniqueNamespace(), config.WriteThroughOnCommit, 256, 0)
	a, b := newRig(t, s), newRig(t, s)
	rng := rand.New(rand.NewPCG(15, 3))
	prompts := make([][]config.Token, 10) // 8 after the stop: some start on a node still up
	for i := range prompts {
		prompts[i] = randTokens(rng, 96)
		_, err := a.e.Serve(a.stream(), fakeengine.Request{Prompt: prompts[i], OutputLen: 1})
		require.NoError(t, err)
	}
	flush(t, a.m)

	serve := func(p []config.Token) int {
		res, err := b.e.Serve(b.stream(), fakeengine.Request{Prompt: concat(p, randTokens(rng, 8)), OutputLen: 1})
		require.NoError(t, err, "the engine never sees the cluster's faults")
		assert.Zero(t, res.Verified.Mismatches)
		assert.Zero(t, res.Final.Mismatches)
		return res.Reused
	}
	for _, p := range prompts[:2] {
		assert.Equal(t, 96, serve(p), "every node up: the whole prompt is reused")
	}
	run("stop-node", "1") // in the middle of node b's run
	reused := 0
	for _, p := range prompts[2:] {
		reused += serve(p)
	}
	flush(t, b.m)
	st := sharedStats(t, b.m)
	assert.Positive(t, st.Store.Errors, "the down node's keys are counted errors")
	assert.Less(t, reused, 8*96, "the blocks on the stopped node are misses")
	assert.Positive(t, reused, "the blocks on the nodes up are reused")
	assert.Zero(t, b.e.Mismatches())
}
