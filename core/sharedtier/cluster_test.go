package sharedtier

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests run against a real Redis Cluster on loopback: `make test` starts
// one (scripts/redis-cluster.sh) and exports its seeds in KVCM_REDIS_CLUSTER.
// The fault tests stop nodes and fill memory, so they start clusters of their
// own on other ports with the same script, and stop them when done.

const clusterEnv = "KVCM_REDIS_CLUSTER"

// sharedCluster returns the seeds of make test's cluster, or skips.
func sharedCluster(t *testing.T) []string {
	t.Helper()
	s := os.Getenv(clusterEnv)
	if s == "" {
		t.Skipf("%s is not set: run under make test, or scripts/redis-cluster.sh start and export %s=$(scripts/redis-cluster.sh addrs)",
			clusterEnv, clusterEnv)
	}
	addrs := strings.Split(s, ",")
	requireLoopback(t, addrs)
	return addrs
}

// requireLoopback refuses to run against anything but this machine.
func requireLoopback(t *testing.T, addrs []string) {
	t.Helper()
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		require.NoError(t, err, "%s: %q", clusterEnv, a)
		ip := net.ParseIP(host)
		require.True(t, ip != nil && ip.IsLoopback(), "%s: %q is not a loopback address", clusterEnv, a)
	}
}

var namespaceSeq atomic.Int64

// namespace is unique to the test and the run, so tests sharing a cluster
// (and runs after an earlier one) never see each other's keys.
func namespace(t *testing.T) string {
	return fmt.Sprintf("t%d-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9, namespaceSeq.Add(1))
}

func script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", "redis-cluster.sh")
}

// privateCluster is a cluster of this test alone, on basePort..basePort+2,
// with maxmemory per node; stopped at cleanup.
type privateCluster struct {
	t    *testing.T
	env  []string
	seed []string
}

func startPrivateCluster(t *testing.T, basePort int, maxmemory string) *privateCluster {
	t.Helper()
	sharedCluster(t) // runs where make test runs the cluster tests
	c := &privateCluster{t: t, env: append(os.Environ(),
		fmt.Sprintf("KVCM_REDIS_BASE_PORT=%d", basePort),
		"KVCM_REDIS_DIR="+filepath.Join(os.TempDir(), fmt.Sprintf("kvcm-redis-cluster-test-%d", basePort)),
		"KVCM_REDIS_MAXMEMORY="+maxmemory)}
	c.run("stop") // one a crashed run left behind would be reused, with its settings
	t.Cleanup(func() { c.run("stop") })
	out := c.run("start")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	c.seed = strings.Split(lines[len(lines)-1], ",")
	requireLoopback(t, c.seed)
	return c
}

func (c *privateCluster) run(args ...string) string {
	cmd := exec.Command("timeout", append([]string{"120", script()}, args...)...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	require.NoError(c.t, err, "redis-cluster.sh %v: %s", args, out)
	return string(out)
}

func (c *privateCluster) cli(port int, args ...string) string {
	out, err := exec.Command("timeout", append([]string{"10", "redis-cli", "-h", "127.0.0.1", "-p", fmt.Sprint(port)}, args...)...).CombinedOutput()
	require.NoError(c.t, err, "redis-cli %v: %s", args, out)
	return string(out)
}

// blob is key's test payload: its bytes depend on the key, so a blob read
// under the wrong key cannot pass for the right one.
func blob(k Key, size int) []byte {
	b := make([]byte, size)
	x := k.Block*0x9e3779b97f4a7c15 ^ binary.LittleEndian.Uint64(k.Fingerprint[:]) ^ uint64(k.Lifecycle)<<32 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

func fingerprint(n uint64) Fingerprint {
	var f Fingerprint
	binary.LittleEndian.PutUint64(f[:], n)
	f[15] = 0xfe // a fingerprint's high bytes matter too
	return f
}

func chain(fp uint64, n int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Key{Fingerprint: fingerprint(fp), Lifecycle: uint32(i % 2), Block: uint64(1000 + i)}
	}
	return keys
}

// verifyBlob is the Verify callback of the tests: the bytes must be key's.
func verifyBlob(size int) func(Key, []byte) error {
	return func(k Key, b []byte) error {
		if !bytes.Equal(b, blob(k, size)) {
			return fmt.Errorf("blob of %v does not match", k)
		}
		return nil
	}
}

func execCommand(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}
