// Package shared is `kvcm bench shared`: the shared tier's write and
// lookup+read throughput (core/sharedtier) beside the Redis Cluster's raw
// pipelined SET/GET throughput at the same value sizes, measured in the same
// run, with their ratios.
//
// The raw reference uses the store's own client (rueidis) without the
// store: pipelined SET of batches of Batch values on Writers goroutines (the
// store's write concurrency), and pipelined GET of batches on one goroutine
// (a lookup is one caller). The store's write is Put of every value then
// Flush (each writer's round trip writes a batch, SET NX, and asks EXISTS
// of the next); its read is
// MatchPrefix over the chain (EXISTS in batches of the store's default
// LookupBatchKeys) then Get (batches of Batch). Each round runs both sides
// back to back, raw first in even rounds and the store first in odd ones. Every value read back is compared to
// the byte after the timed part. A third measurement of each round is the
// manager's onboarding of the same bytes (onboard.go), beside a raw GET of
// the same blobs timed next to it.
package shared

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/kvcm/kvcm/core/sharedtier"
	"github.com/kvcm/kvcm/internal/bench/stats"
	"github.com/redis/rueidis"
)

// Config is one run.
type Config struct {
	Addresses []string
	Sizes     []int // value sizes, bytes
	Bytes     int64 // bytes written (and read) per size, per measurement
	Batch     int   // keys per pipelined round trip
	Writers   int
	Rounds    int // interleaved rounds; medians are reported
}

// Row is one value size's medians: GB/s (1e9 bytes per second), and the
// ratios store/raw of each round (raw and store run back to back in a
// round, so a ratio compares like with like on a noisy machine).
type Row struct {
	Size                  int
	RawSet, StoreWrite    float64
	RawGet, StoreRead     float64
	WriteRatio, ReadRatio float64
	// Onboard is the manager's onboarding (see onboard.go), OnboardRawGet
	// the raw GET of the same blobs timed beside it, and OnboardRatio the
	// median of the rounds' Onboard/OnboardRawGet.
	Onboard, OnboardRawGet, OnboardRatio float64
}

func (c Config) validate() error {
	switch {
	case len(c.Addresses) == 0:
		return errors.New("bench shared: -addrs: no cluster address (set KVCM_REDIS_CLUSTER or -addrs; scripts/redis-cluster.sh start)")
	case len(c.Sizes) == 0:
		return errors.New("bench shared: -sizes: empty")
	case c.Bytes <= 0, c.Batch <= 0, c.Writers <= 0, c.Rounds <= 0:
		return errors.New("bench shared: -bytes, -batch, -writers and -rounds must be positive")
	}
	for _, s := range c.Sizes {
		if s <= 0 || int64(s) > c.Bytes {
			return fmt.Errorf("bench shared: -sizes: %d must be in 1..-bytes (%d)", s, c.Bytes)
		}
	}
	return nil
}

// Run measures every size and returns its row.
func Run(ctx context.Context, cfg Config, progress io.Writer) ([]Row, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	raw, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cfg.Addresses, DisableCache: true,
		ConnWriteTimeout: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("bench shared: connect: %w", err)
	}
	defer raw.Close()
	ns := fmt.Sprintf("bench%d", time.Now().UnixNano())
	if err := warm(ctx, raw, ns); err != nil {
		return nil, err
	}
	var rows []Row
	for _, size := range cfg.Sizes {
		n := int(max(int64(cfg.Batch), cfg.Bytes/int64(size)))
		val := make([]byte, size)
		for i := range val {
			val[i] = byte(i*131 + size)
		}
		var rs, sw, rg, sr, wr, rr, ob, og2, or []float64
		for round := range cfg.Rounds {
			prefix := fmt.Sprintf("kvcm-bench-raw:%s:%d:%d:", ns, size, round)
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("%s%d", prefix, i)
			}
			var set, get, w, r time.Duration
			rawSide := func() (err error) {
				if set, err = rawSet(ctx, raw, keys, val, cfg); err != nil {
					return err
				}
				if get, err = rawGet(ctx, raw, keys, val, cfg.Batch); err != nil {
					return err
				}
				return del(ctx, raw, keys, cfg.Batch)
			}
			storeSide := func() error {
				var skeys []string
				var err error
				if w, r, skeys, err = storeRound(ctx, cfg, fmt.Sprintf("%s-%d-%d", ns, size, round), n, val); err != nil {
					return err
				}
				return del(ctx, raw, skeys, cfg.Batch)
			}
			sides := []func() error{rawSide, storeSide}
			if round%2 == 1 { // alternate which side runs first
				sides[0], sides[1] = sides[1], sides[0]
			}
			for _, side := range sides {
				if err := side(); err != nil {
					return nil, err
				}
			}
			ons := fmt.Sprintf("%s-onboard-%d-%d", ns, size, round)
			o, og, obytes, err := onboardRound(ctx, raw, cfg, ons, round, n, size)
			if err == nil {
				err = delNamespace(ctx, raw, ons)
			}
			if err != nil {
				return nil, err
			}
			rs, rg = append(rs, gbps(n*size, set)), append(rg, gbps(n*size, get))
			sw, sr = append(sw, gbps(n*size, w)), append(sr, gbps(n*size, r))
			wr, rr = append(wr, sw[round]/rs[round]), append(rr, sr[round]/rg[round])
			ob, og2 = append(ob, gbps(n*size, o)), append(og2, gbps(obytes, og))
			or = append(or, ob[round]/og2[round])
			fmt.Fprintf(progress, "size %d round %d: raw set %.2f get %.2f, store write %.2f read %.2f, onboard %.2f (raw get beside it %.2f) GB/s\n",
				size, round, rs[round], rg[round], sw[round], sr[round], ob[round], og2[round])
		}
		rows = append(rows, Row{Size: size, RawSet: stats.Median(rs), StoreWrite: stats.Median(sw), RawGet: stats.Median(rg),
			StoreRead: stats.Median(sr), WriteRatio: stats.Median(wr), ReadRatio: stats.Median(rr), Onboard: stats.Median(ob),
			OnboardRawGet: stats.Median(og2), OnboardRatio: stats.Median(or)})
	}
	return rows, nil
}

// warm connects c to every node before any clock starts, as the store's
// warm-up does: one pipelined EXISTS of keys spread over every slot owner.
func warm(ctx context.Context, c rueidis.Client, ns string) error {
	cmds := make(rueidis.Commands, 64)
	for i := range cmds {
		cmds[i] = c.B().Exists().Key(fmt.Sprintf("kvcm-bench-warm:%s:%d", ns, i)).Build()
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("bench shared: warm-up: %w", err)
		}
	}
	return nil
}

func gbps(bytes int, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

func batches(keys []string, batch int) [][]string {
	var out [][]string
	for i := 0; i < len(keys); i += batch {
		out = append(out, keys[i:min(i+batch, len(keys))])
	}
	return out
}

// rawSet writes keys on cfg.Writers goroutines, one pipelined SET batch at a
// time each.
func rawSet(ctx context.Context, c rueidis.Client, keys []string, val []byte, cfg Config) (time.Duration, error) {
	work := make(chan []string, len(keys)/cfg.Batch+1)
	for _, b := range batches(keys, cfg.Batch) {
		work <- b
	}
	close(work)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	start := time.Now()
	for range cfg.Writers {
		wg.Go(func() {
			for b := range work {
				cmds := make(rueidis.Commands, len(b))
				for i, k := range b {
					cmds[i] = c.B().Set().Key(k).Value(rueidis.BinaryString(val)).Build()
				}
				for _, r := range c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						mu.Lock()
						first = cmp(first, err)
						mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	if first != nil {
		return 0, fmt.Errorf("bench shared: raw set: %w", first)
	}
	return d, nil
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// rawGet reads keys back, one pipelined GET batch at a time, and checks the
// bytes after the clock stops.
func rawGet(ctx context.Context, c rueidis.Client, keys []string, val []byte, batch int) (time.Duration, error) {
	got := make([][]byte, 0, len(keys))
	start := time.Now()
	for _, b := range batches(keys, batch) {
		cmds := make(rueidis.Commands, len(b))
		for i, k := range b {
			cmds[i] = c.B().Get().Key(k).Build()
		}
		for _, r := range c.DoMulti(ctx, cmds...) {
			v, err := r.AsBytes()
			if err != nil {
				return 0, fmt.Errorf("bench shared: raw get: %w", err)
			}
			got = append(got, v)
		}
	}
	d := time.Since(start)
	for i, v := range got {
		if string(v) != string(val) {
			return 0, fmt.Errorf("bench shared: raw get: value %d differs", i)
		}
	}
	return d, nil
}

func del(ctx context.Context, c rueidis.Client, keys []string, batch int) error {
	for _, b := range batches(keys, batch) {
		cmds := make(rueidis.Commands, len(b))
		for i, k := range b {
			cmds[i] = c.B().Del().Key(k).Build()
		}
		for _, r := range c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return fmt.Errorf("bench shared: del: %w", err)
			}
		}
	}
	return nil
}

// storeRound writes n blobs through a Store and reads them back; it returns
// both times and the cluster keys, for cleanup.
func storeRound(ctx context.Context, cfg Config, ns string, n int, val []byte) (w, r time.Duration, names []string, err error) {
	s, err := sharedtier.Open(sharedtier.Options{Addresses: cfg.Addresses, Namespace: ns, BatchKeys: cfg.Batch,
		Writers: cfg.Writers, QueueBlobs: n, QueueBytes: int64(n)*int64(len(val)) + 1,
		CallTimeout: 10 * time.Second})
	if err != nil {
		return 0, 0, nil, err
	}
	defer s.Close()
	keys := make([]sharedtier.Key, n)
	names = make([]string, n)
	for i := range keys {
		keys[i] = sharedtier.Key{Fingerprint: sharedtier.Fingerprint{0xbe, 0x4c}, Lifecycle: 0, Block: uint64(i)}
		names[i] = s.KeyName(keys[i])
	}
	// Connect to every node before the clock starts, as the raw client is
	// (warm): the first batch of EXISTS spans every slot owner, and finds
	// nothing, which ends the match.
	if n, err := s.MatchPrefix(ctx, keys); err != nil || n != 0 {
		return 0, 0, names, fmt.Errorf("bench shared: store warm-up matched %d keys: %v", n, err)
	}
	start := time.Now()
	for _, k := range keys {
		if !s.Put(k, val) {
			return 0, 0, names, errors.New("bench shared: store: a Put was dropped")
		}
	}
	if err := s.Flush(ctx); err != nil {
		return 0, 0, names, err
	}
	w = time.Since(start)
	if st := s.Stats(); st.Written != int64(n) {
		return 0, 0, names, fmt.Errorf("bench shared: store wrote %d of %d blobs (%d errors)", st.Written, n, st.WriteErrors)
	}
	start = time.Now()
	matched, err := s.MatchPrefix(ctx, keys)
	if err != nil || matched != n {
		return 0, 0, names, fmt.Errorf("bench shared: store matched %d of %d: %v", matched, n, err)
	}
	blobs, err := s.Get(ctx, keys)
	r = time.Since(start)
	if err != nil {
		return 0, 0, names, err
	}
	for i, b := range blobs {
		if string(b) != string(val) {
			return 0, 0, names, fmt.Errorf("bench shared: store blob %d differs", i)
		}
	}
	return w, r, names, nil
}

// Print writes the table.
func Print(w io.Writer, cfg Config, rows []Row) {
	fmt.Fprintf(w, "Redis Cluster %s: %d MiB per point, batches of %d, %d writers, medians of %d rounds (GB/s; ratios: median of the rounds' store/raw)\n",
		strings.Join(cfg.Addresses, ","), cfg.Bytes>>20, cfg.Batch, cfg.Writers, cfg.Rounds)
	fmt.Fprintf(w, "%-9s %9s %12s %6s %9s %12s %6s %9s %9s %6s\n", "value", "raw SET", "store write", "ratio", "raw GET", "store read", "ratio",
		"onboard", "raw GET'", "ratio")
	for _, r := range rows {
		fmt.Fprintf(w, "%-9s %9.2f %12.2f %6.2f %9.2f %12.2f %6.2f %9.2f %9.2f %6.2f\n", sizeName(r.Size),
			r.RawSet, r.StoreWrite, r.WriteRatio, r.RawGet, r.StoreRead, r.ReadRatio, r.Onboard, r.OnboardRawGet, r.OnboardRatio)
	}
	fmt.Fprintln(w, "onboard: a second manager's create_kv_cache + resume of the blocks a first wrote (lookup, fetch, host, decode to the GPU), against raw GET': a raw GET of the same blobs timed beside it")
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
