package shared

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A run prints one row per size with both sides measured and their ratio.
func TestRunMeasuresBothSides(t *testing.T) {
	s := os.Getenv("KVCM_REDIS_CLUSTER")
	if s == "" {
		t.Skip("KVCM_REDIS_CLUSTER is not set (scripts/redis-cluster.sh start; make test sets it)")
	}
	cfg := Config{Addresses: strings.Split(s, ","), Sizes: []int{16 << 10, 1 << 20}, Bytes: 2 << 20, Batch: 8, Writers: 2, Rounds: 1}
	rows, err := Run(context.Background(), cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	for _, r := range rows {
		for _, v := range []float64{r.RawSet, r.RawGet, r.StoreWrite, r.StoreRead, r.WriteRatio, r.ReadRatio, r.Onboard, r.OnboardRatio} {
			assert.Positive(t, v)
		}
	}
	var out bytes.Buffer
	Print(&out, cfg, rows)
	assert.Contains(t, out.String(), "1MiB")
}

// Bad flags are usage errors naming the flag, and need no cluster.
func TestMainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-addrs", ""}, {"-addrs", "127.0.0.1:1", "-sizes", "0"}, {"-addrs", "127.0.0.1:1", "-rounds", "0"}} {
		var stderr bytes.Buffer
		assert.Equal(t, 2, Main(args, io.Discard, &stderr), "%v", args)
		assert.Contains(t, stderr.String(), "bench shared")
	}
}
