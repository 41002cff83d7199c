package bench

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

const (
	tokensPerBlock = 32
	// Four layers of a key and a value buffer of one byte a token: a page is
	// 256 bytes, so even 128k-token prompts need little memory, and the
	// emulated device never touches pages nobody writes.
	numLayers = 4
	pageBytes = numLayers * 2 * tokensPerBlock
	// tailTokens is the part of each request's prompt that is its own.
	tailTokens = 2 * tokensPerBlock
)

func benchConfig(slots int64) config.Config {
	kv := []config.BufferConfig{{Role: config.RoleKey, Size: tokensPerBlock}, {Role: config.RoleValue, Size: tokensPerBlock}}
	cfg := config.Config{
		TokensPerBlock: tokensPerBlock,
		CacheTiers:     []config.CacheTierConfig{config.GPU(slots * pageBytes)},
		// The GPU level is sized to the workload, so one suspended request
		// holds most of it; never refuse its resume.
		MaxUtilForResume: 1,
	}
	for l := range numLayers {
		cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{LayerID: int32(l), Buffers: kv})
	}
	return cfg
}

type rig struct {
	dev    *emu.Device
	m      *core.Manager
	stream device.Stream
}

func newRig(b *testing.B, slots int64) *rig {
	b.Helper()
	r := &rig{dev: emu.New(emu.Options{})}
	var err error
	if r.m, err = core.NewManager(benchConfig(slots), core.WithDevice(r.dev)); err != nil {
		b.Fatal(err)
	}
	if r.stream, err = r.dev.NewStream(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		r.stream.Close()
		if err := r.m.Close(); err != nil {
			b.Error(err)
		}
		r.dev.Close()
	})
	return r
}

func randTokens(seed uint64, n int) []config.Token {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]config.Token, n)
	for i := range out {
		out[i] = config.Token(rng.IntN(32000))
	}
	return out
}

// serve runs one request's bookkeeping: create (reusing what is cached),
// resume, resize to the whole prompt with its history computed, commit the
// computed tokens, suspend, resume, close. It returns the reused tokens.
func (r *rig) serve(b *testing.B, prompt []config.Token) int {
	c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: prompt})
	if err != nil {
		b.Fatal(err)
	}
	reused := c.ReusedTokens()
	if err := c.Resume(r.stream); err != nil {
		b.Fatal(err)
	}
	if err := c.Resize(len(prompt), len(prompt)); err != nil {
		b.Fatal(err)
	}
	if err := c.Commit(prompt[reused:], false); err != nil {
		b.Fatal(err)
	}
	if err := c.Suspend(); err != nil {
		b.Fatal(err)
	}
	if err := c.Resume(r.stream); err != nil {
		b.Fatal(err)
	}
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
	return reused
}

var promptSizes = []struct {
	name   string
	tokens int
}{{"1k", 1 << 10}, {"8k", 8 << 10}, {"128k", 128 << 10}}

// BenchmarkRequest is the per-request bookkeeping cost of
// create-with-reuse → resume → resize → commit → suspend → resume → close.
// Every request's prompt is a cached shared prefix followed by two blocks of
// its own, which it commits. Without eviction the GPU level has room for
// everything the run commits; with eviction it has room for the prefix and
// 16 more requests, so every request evicts the two oldest tail blocks
// (evictions/op ≈ 2).
func BenchmarkRequest(b *testing.B) {
	for _, ps := range promptSizes {
		for _, pressure := range []bool{false, true} {
			name := fmt.Sprintf("prompt=%s/eviction=%v", ps.name, pressure)
			b.Run(name, func(b *testing.B) {
				prefixBlocks := int64(ps.tokens-tailTokens) / tokensPerBlock
				slots := prefixBlocks + 2*int64(b.N+1) + 8
				if pressure {
					slots = prefixBlocks + 2*16 + 2
				}
				r := newRig(b, slots)
				prompt := randTokens(uint64(ps.tokens), ps.tokens)
				r.serve(b, prompt) // caches the shared prefix
				tail := prompt[ps.tokens-tailTokens:]
				// Fill the level first under pressure so every timed
				// request evicts.
				warm := 0
				if pressure {
					warm = 20
				}
				for i := range warm {
					tail[0] = config.Token(-1 - i)
					r.serve(b, prompt)
				}
				before := r.m.Stats()
				b.ReportAllocs()
				b.ResetTimer()
				reused := 0
				for i := range b.N {
					// A unique first token makes the tail the request's own.
					tail[0] = config.Token(32000 + i)
					reused += r.serve(b, prompt)
				}
				b.StopTimer()
				after := r.m.Stats()
				want := ps.tokens - tailTokens
				if reused != want*b.N {
					b.Fatalf("reused %d tokens over %d requests, want %d each", reused, b.N, want)
				}
				b.ReportMetric(float64(after.Evictions-before.Evictions)/float64(b.N), "evictions/op")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(ps.tokens/tokensPerBlock), "ns/block")
			})
		}
	}
}

// BenchmarkProbeReuse is the prefix-match time against the length of a
// cached prompt: ns/token must stay flat for the match to be linear.
func BenchmarkProbeReuse(b *testing.B) {
	for tokens := 1 << 10; tokens <= 128<<10; tokens *= 2 {
		b.Run(fmt.Sprintf("tokens=%dk", tokens>>10), func(b *testing.B) {
			r := newRig(b, int64(tokens/tokensPerBlock)+8)
			// One more token than the cached prompt, so all of it is
			// reusable (a cache always computes its last token).
			input := randTokens(uint64(tokens), tokens+1)
			r.serve(b, input[:tokens])
			r.serve(b, input) // commits the last full block too
			scope := blockhash.Scope{}
			if got := r.m.ProbeReuse(scope, input); got != tokens {
				b.Fatalf("ProbeReuse = %d, want %d", got, tokens)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				r.m.ProbeReuse(scope, input)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(tokens), "ns/token")
		})
	}
}

// BenchmarkMigratedPage is the manager's cost per migrated page, apart from
// the copy itself. Two suspended requests of K pages take turns on a GPU
// level that holds only one of them, over a host level that holds both: each
// resume decodes K pages up and encodes K pages down. The same number of
// page copies, as one raw batch per direction on the same device, is timed in
// the same run as the reference; bookkeeping-ns/page is the difference.
func BenchmarkMigratedPage(b *testing.B) {
	const k = 512
	cfg := benchConfig(k)
	cfg.CacheTiers = append(cfg.CacheTiers, config.Host(4*k*pageBytes))
	r := &rig{dev: emu.New(emu.Options{})}
	var err error
	if r.m, err = core.NewManager(cfg, core.WithDevice(r.dev)); err != nil {
		b.Fatal(err)
	}
	if r.stream, err = r.dev.NewStream(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		r.stream.Close()
		r.m.Close()
		r.dev.Close()
	}()
	var caches [2]*core.KVCache
	for i := range caches {
		prompt := randTokens(uint64(i), k*tokensPerBlock)
		c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: prompt})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Resume(r.stream); err != nil {
			b.Fatal(err)
		}
		if err := c.Resize(len(prompt), len(prompt)); err != nil {
			b.Fatal(err)
		}
		if err := c.Suspend(); err != nil {
			b.Fatal(err)
		}
		caches[i] = c
	}
	copyNs := rawCopyNs(b, r.dev, r.stream, k)
	moved := func() int64 {
		var n int64
		for _, c := range r.m.MigrationStats() {
			n += c.Pages
		}
		return n
	}
	before := moved()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		c := caches[i%2]
		if err := c.Resume(r.stream); err != nil {
			b.Fatal(err)
		}
		if err := c.Suspend(); err != nil {
			b.Fatal(err)
		}
	}
	if err := r.stream.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	pages := moved() - before
	if pages < int64(b.N)*k {
		b.Fatalf("moved %d pages in %d turns, want at least %d a turn", pages, b.N, k)
	}
	perPage := float64(b.Elapsed().Nanoseconds()) / float64(pages)
	b.ReportMetric(perPage, "ns/page")
	b.ReportMetric(copyNs, "copy-ns/page")
	b.ReportMetric(perPage-copyNs, "bookkeeping-ns/page")
	for _, c := range caches {
		c.Close()
	}
}

// rawCopyNs times batches of n page-sized copies between device and
// host-mapped memory, per page.
func rawCopyNs(b *testing.B, dev *emu.Device, s device.Stream, n int) float64 {
	src, err := dev.Alloc(device.DeviceMemory, int64(n)*pageBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Free()
	dst, err := dev.Alloc(device.HostMapped, int64(n)*pageBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Free()
	descs := make([]device.CopyDesc, n)
	for i := range descs {
		descs[i] = device.CopyDesc{Dst: dst.Ptr().Add(int64(i) * pageBytes), Src: src.Ptr().Add(int64(i) * pageBytes), Size: pageBytes}
	}
	// Timed by hand: testing.Benchmark cannot run inside a benchmark.
	start, rounds := time.Now(), 0
	for time.Since(start) < 100*time.Millisecond {
		if err := s.BatchCopy(descs); err != nil {
			b.Fatal(err)
		}
		rounds++
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	return float64(time.Since(start).Nanoseconds()) / float64(rounds*n)
}
