package shared

// Why the store's writers send one round trip a batch (docs/benchmarks.md,
// "issue 15, the write path"): the time of one batch of 32 values written
// the three ways, interleaved in one run on one goroutine, with the raw
// pipelined SET as the reference.
//
//	KVCM_REDIS_CLUSTER=$(scripts/redis-cluster.sh addrs) \
//	  go test ./internal/bench/shared -run '^$' -bench WriteRoundTrip -benchtime 100x

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvcm/kvcm/internal/bench/stats"
	"github.com/redis/rueidis"
)

// BenchmarkWriteRoundTrip reports, per value size, the median time of a
// batch written as a raw pipelined SET ("set", the reference), as the
// store's writers did before (a round trip of EXISTS, then one of SET NX:
// "exists-then-set") and as they do now (SET NX of the batch and EXISTS of
// the next in one round trip: "set+next-exists"), and each one's ratio to
// the reference (reference time / its time: 1 is as fast as raw SET).
func BenchmarkWriteRoundTrip(b *testing.B) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: clusterAddrs(b), DisableCache: true,
		ConnWriteTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := warm(ctx, c, "roundtrip"); err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{16 << 10, 256 << 10, 2 << 20} {
		val := make([]byte, size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			cmds := func(sets, exists []string) rueidis.Commands {
				var out rueidis.Commands
				for _, k := range sets {
					out = append(out, c.B().Set().Key(k).Value(rueidis.BinaryString(val)).Nx().Build())
				}
				for _, k := range exists {
					out = append(out, c.B().Exists().Key(k).Build())
				}
				return out
			}
			do := func(cs rueidis.Commands) {
				for _, r := range c.DoMulti(ctx, cs...) {
					if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
						b.Fatal(err)
					}
				}
			}
			var set, old, now []time.Duration
			round := 0
			for b.Loop() {
				keys := make([]string, 2*clientBatch)
				for i := range keys {
					keys[i] = fmt.Sprintf("kvcm-bench-roundtrip:%d:%d:%d", size, round, i)
				}
				batch, next := keys[:clientBatch], keys[clientBatch:]
				start := time.Now()
				switch round % 3 {
				case 0:
					do(cmds(batch, nil))
					set = append(set, time.Since(start))
				case 1:
					do(cmds(nil, batch))
					do(cmds(batch, nil))
					old = append(old, time.Since(start))
				case 2:
					do(cmds(batch, next))
					now = append(now, time.Since(start))
				}
				b.StopTimer()
				if err := del(ctx, c, keys, len(keys)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				round++
			}
			if len(now) == 0 {
				b.Skip("needs 3 iterations at least (-benchtime 3x)")
			}
			ref := stats.Median(set)
			b.ReportMetric(float64(ref.Microseconds()), "set-µs")
			b.ReportMetric(float64(ref)/float64(stats.Median(old)), "exists-then-set-ratio")
			b.ReportMetric(float64(ref)/float64(stats.Median(now)), "set+next-exists-ratio")
		})
	}
}
