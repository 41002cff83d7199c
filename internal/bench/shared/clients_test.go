package shared

// The client choice (docs/benchmarks.md, "Shared tier: the Redis client"):
// rueidis and go-redis/v9 on the same cluster, pipelined SET and GET of
// values from 16 KiB to 2 MiB and batched EXISTS across slots, in one run.
//
//	scripts/redis-cluster.sh start
//	KVCM_REDIS_CLUSTER=$(scripts/redis-cluster.sh addrs) \
//	  go test ./internal/bench/shared -run '^$' -bench Clients -benchtime 2x

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

const clientBatch = 32

func clusterAddrs(b *testing.B) []string {
	s := os.Getenv("KVCM_REDIS_CLUSTER")
	if s == "" {
		b.Skip("KVCM_REDIS_CLUSTER is not set (scripts/redis-cluster.sh start; make test sets it)")
	}
	return strings.Split(s, ",")
}

// clientOps is what the comparison needs from a client: one pipelined round
// trip per call.
type clientOps interface {
	set(ctx context.Context, keys []string, val []byte) error
	get(ctx context.Context, keys []string) (int, error)
	exists(ctx context.Context, keys []string) (int, error)
	close()
}

type rueidisOps struct{ c rueidis.Client }

func (r rueidisOps) set(ctx context.Context, keys []string, val []byte) error {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Set().Key(k).Value(rueidis.BinaryString(val)).Build()
	}
	for _, res := range r.c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return err
		}
	}
	return nil
}

func (r rueidisOps) get(ctx context.Context, keys []string) (int, error) {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Get().Key(k).Build()
	}
	n := 0
	for _, res := range r.c.DoMulti(ctx, cmds...) {
		v, err := res.AsBytes()
		if err != nil {
			return n, err
		}
		n += len(v)
	}
	return n, nil
}

func (r rueidisOps) exists(ctx context.Context, keys []string) (int, error) {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Exists().Key(k).Build()
	}
	n := 0
	for _, res := range r.c.DoMulti(ctx, cmds...) {
		v, err := res.AsInt64()
		if err != nil {
			return n, err
		}
		n += int(v)
	}
	return n, nil
}

func (r rueidisOps) close() { r.c.Close() }

type goredisOps struct{ c *redis.ClusterClient }

func (g goredisOps) set(ctx context.Context, keys []string, val []byte) error {
	_, err := g.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Set(ctx, k, val, 0)
		}
		return nil
	})
	return err
}

func (g goredisOps) get(ctx context.Context, keys []string) (int, error) {
	cmds, err := g.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Get(ctx, k)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range cmds {
		v, err := c.(*redis.StringCmd).Bytes()
		if err != nil {
			return n, err
		}
		n += len(v)
	}
	return n, nil
}

func (g goredisOps) exists(ctx context.Context, keys []string) (int, error) {
	cmds, err := g.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Exists(ctx, k)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range cmds {
		n += int(c.(*redis.IntCmd).Val())
	}
	return n, nil
}

func (g goredisOps) close() { g.c.Close() }

func newClients(b *testing.B, addrs []string) map[string]clientOps {
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true,
		ConnWriteTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	gc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second})
	return map[string]clientOps{"rueidis": rueidisOps{rc}, "go-redis": goredisOps{gc}}
}

// BenchmarkClients reports, per client and value size, pipelined SET and GET
// bytes per second (batches of 32 keys spread over every slot) and batched
// EXISTS lookups per second (over the 2,048 keys of the 16 KiB pass).
func BenchmarkClients(b *testing.B) {
	addrs := clusterAddrs(b)
	ctx := context.Background()
	clients := newClients(b, addrs)
	defer func() {
		for _, c := range clients {
			c.close()
		}
	}()
	for _, size := range []int{16 << 10, 256 << 10, 2 << 20} {
		val := make([]byte, size)
		for i := range val {
			val[i] = byte(i * 7)
		}
		nkeys := max(clientBatch, (32<<20)/size) // 32 MiB a pass
		for _, name := range []string{"rueidis", "go-redis"} {
			c := clients[name]
			keys := make([]string, nkeys)
			for i := range keys {
				keys[i] = fmt.Sprintf("kvcm-bench-clients:%s:%d:%d", name, size, i)
			}
			batches := func(f func([]string) error) error {
				for i := 0; i < len(keys); i += clientBatch {
					if err := f(keys[i:min(i+clientBatch, len(keys))]); err != nil {
						return err
					}
				}
				return nil
			}
			// One untimed pass, so that connections and slot maps exist.
			if err := batches(func(k []string) error { return c.set(ctx, k, val) }); err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/set/%dKiB", name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(nkeys * size))
				for b.Loop() {
					if err := batches(func(k []string) error { return c.set(ctx, k, val) }); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%s/get/%dKiB", name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(nkeys * size))
				for b.Loop() {
					if err := batches(func(k []string) error {
						n, err := c.get(ctx, k)
						if err == nil && n != len(k)*size {
							err = fmt.Errorf("got %d bytes, want %d", n, len(k)*size)
						}
						return err
					}); err != nil {
						b.Fatal(err)
					}
				}
			})
			if size != 16<<10 {
				continue
			}
			b.Run(fmt.Sprintf("%s/exists/%dkeys", name, nkeys), func(b *testing.B) {
				for b.Loop() {
					if err := batches(func(k []string) error {
						n, err := c.exists(ctx, k)
						if err == nil && n != len(k) {
							err = fmt.Errorf("%d of %d keys exist", n, len(k))
						}
						return err
					}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(nkeys*b.N)/b.Elapsed().Seconds(), "keys/s")
			})
		}
	}
}
