package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

var demoCommand = command{
	name:    "demo",
	summary: "serve a shared-prefix workload on a GPU or the emulated device and check every reused byte",
	synopsis: `Serves groups of requests that share a long system prompt, in shuffled order,
through the manager with the fake engine, on a CUDA GPU when there is one
(--device auto, the default) or on the emulated device. The engine
writes deterministic KV bytes for every computed token and verifies, byte for
byte, every page a request reuses and every page it holds when it finishes.
The GPU quota is small enough by default that the workload does not fit:
evicted blocks fall to a host tier and then to a disk tier, and come back
(decoded) when a later request reuses them. Every eighth request is
preempted after its first step, its pages prefetched back to the host tier
while another request runs, and resumed. Twice during the run the GPU and
host tiers are shrunk (evicting and defragmenting) and grown back. A table of
migrations per path is printed at the end.

Cold pages are moved by the auto codec by default (--codec auto): on a GPU,
per layer group, below the chunk size where DMA catches up
(gpucodec.StagedCrossoverBytes) the staged codec (pages gathered by the
gather kernel into device staging, then moved by DMA in contiguous chunks),
and DMA above it; on the emulated device, the default codec. --codec gather
keeps the gather kernel over mapped host memory below the crossover
(gpucodec.StageNever); --codec staged stages on every device, over the
default codec's device copies on the emulated device (gpucodec.StageAlways);
--codec default always uses the default (DMA) codec.

The last line is "integrity: <N> pages verified, <M> mismatches"; the exit
status is 1 when M > 0.

With --shared ADDRS (a Redis Cluster's seeds; make demo-cluster starts one)
two nodes share the cluster as a shared tier: node a serves the first
request of every group and writes its blocks through; node b, another
manager on another device (--shared-node b runs it alone, in another
process), serves the others and reuses the system prompts node a computed,
onboarded from the cluster and verified byte for byte. Each node prints
"node <n>: integrity: ..." last.`,
	setup: setupDemo,
}

// The demo's model: full-attention layers and sliding-window layers, each
// with a key and a value buffer of demoBufferBytesPerToken bytes a token.
const (
	demoFullLayers          = 6
	demoWindowLayers        = 2
	demoBufferBytesPerToken = 64
)

type demoFlags struct {
	seed                                       int64
	groups, perGroup                           int
	systemTokens, questionTokens, outputTokens int
	tokensPerBlock, window, chunk              int
	gpuQuota, hostQuota, diskQuota             byteSize
	diskPath                                   string
	maxDelay                                   time.Duration
	progress                                   string
	device, codec                              string
	shared                                     sharedDemoFlags
}

// demoStaging is the auto codec's staging for each --codec but default.
var demoStaging = map[string]gpucodec.Staging{
	"auto":   gpucodec.StageWithKernel,
	"gather": gpucodec.StageNever,
	"staged": gpucodec.StageAlways,
}

func setupDemo(fs *flag.FlagSet) func(stdout, stderr io.Writer) int {
	f := &demoFlags{gpuQuota: 8 << 20, hostQuota: 2 << 20, diskQuota: 64 << 20}
	fs.Int64Var(&f.seed, "seed", 1, "seed of the workload, the fake model and the device's delays")
	fs.IntVar(&f.groups, "groups", 16, "request groups; a group's requests share one system prompt")
	fs.IntVar(&f.perGroup, "per-group", 8, "requests per group")
	fs.IntVar(&f.systemTokens, "system-tokens", 1024, "tokens of each group's system prompt")
	fs.IntVar(&f.questionTokens, "question-tokens", 64, "mean tokens of a request's own question (uniform in [n/2, 3n/2])")
	fs.IntVar(&f.outputTokens, "output-tokens", 32, "tokens generated per request")
	fs.IntVar(&f.tokensPerBlock, "tokens-per-block", 32, "tokens per KV block")
	fs.IntVar(&f.window, "window", 512, "attention window of the model's sliding-window layers (0: all layers attend fully)")
	fs.IntVar(&f.chunk, "chunk-tokens", 256, "prefill chunk: prompt tokens computed per engine step")
	fs.Var(&f.gpuQuota, "gpu-quota", "GPU tier quota, in bytes or with a unit (KiB, MiB, GiB)")
	fs.Var(&f.hostQuota, "host-quota", "host tier quota (0: no host tier)")
	fs.Var(&f.diskQuota, "disk-quota", "disk tier quota (0: no disk tier)")
	fs.StringVar(&f.diskPath, "disk-path", "", "directory of the disk tier (default: a temporary directory, removed afterwards)")
	fs.StringVar(&f.device, "device", backend.Auto, "device: cuda, emu, or auto (cuda when a GPU is present, else emu)")
	fs.StringVar(&f.codec, "codec", "auto", "cold-page codec: auto (staged over the gather kernel or DMA per layer group by chunk size; DMA on emu), gather (the kernel instead of staging), staged (staging on every device) or default (DMA)")
	fs.DurationVar(&f.maxDelay, "max-delay", 0, "emulated device: delay every stream operation by a random duration below this")
	fs.StringVar(&f.progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), always or never")
	fs.StringVar(&f.shared.addrs, "shared", "", "Redis Cluster seed addresses, comma-separated: run the two-node shared tier demo (see demoshared.go) instead")
	fs.StringVar(&f.shared.node, "shared-node", "both", "with --shared: the node to run, a (writes), b (reuses) or both in turn")
	fs.StringVar(&f.shared.namespace, "shared-namespace", "kvcm-demo", "with --shared: the shared tier's key namespace, the same for both nodes")
	return func(stdout, stderr io.Writer) int { return runDemo(f, stdout, stderr) }
}

func (f *demoFlags) validate() error {
	for _, c := range []struct {
		name string
		v    int
		min  int
	}{
		{"groups", f.groups, 1}, {"per-group", f.perGroup, 1}, {"system-tokens", f.systemTokens, 0},
		{"question-tokens", f.questionTokens, 1}, {"output-tokens", f.outputTokens, 0},
		{"tokens-per-block", f.tokensPerBlock, 1}, {"window", f.window, 0}, {"chunk-tokens", f.chunk, 1},
	} {
		if c.v < c.min {
			return fmt.Errorf("--%s must be at least %d, got %d", c.name, c.min, c.v)
		}
	}
	if f.gpuQuota <= 0 {
		return errors.New("--gpu-quota must be positive")
	}
	if f.hostQuota < 0 || f.diskQuota < 0 {
		return errors.New("--host-quota and --disk-quota must not be negative")
	}
	switch f.device {
	case backend.Auto, backend.CUDA, backend.Emu:
	default:
		return fmt.Errorf("--device must be auto, cuda or emu, got %q", f.device)
	}
	if _, ok := demoStaging[f.codec]; !ok && f.codec != "default" {
		return fmt.Errorf("--codec must be auto, gather, staged or default, got %q", f.codec)
	}
	if f.progress != "auto" && f.progress != "always" && f.progress != "never" {
		return fmt.Errorf("--progress must be auto, always or never, got %q", f.progress)
	}
	return nil
}

func (f *demoFlags) config(diskPath string) config.Config {
	size := int64(demoBufferBytesPerToken * f.tokensPerBlock)
	kv := []config.BufferConfig{{Role: config.RoleKey, Size: size}, {Role: config.RoleValue, Size: size}}
	cfg := config.Config{TokensPerBlock: f.tokensPerBlock, CacheTiers: []config.CacheTierConfig{config.GPU(int64(f.gpuQuota))}}
	if f.hostQuota > 0 {
		cfg.CacheTiers = append(cfg.CacheTiers, config.Host(int64(f.hostQuota)))
	}
	if f.diskQuota > 0 {
		cfg.CacheTiers = append(cfg.CacheTiers, config.Disk(int64(f.diskQuota), diskPath))
	}
	for l := range demoFullLayers + demoWindowLayers {
		layer := config.AttentionLayerConfig{LayerID: int32(l), Buffers: kv}
		if l >= demoFullLayers {
			layer.SlidingWindowSize = f.window
		}
		cfg.Layers = append(cfg.Layers, layer)
	}
	return cfg
}

// demoRequest is one request of the workload and its group.
type demoRequest struct {
	fakeengine.Request
	group int
}

// workload returns the requests in serving order.
func (f *demoFlags) workload() []demoRequest {
	rng := rand.New(rand.NewPCG(uint64(f.seed), 0x64656d6f)) // "demo"
	tokens := func(n int) []config.Token {
		out := make([]config.Token, n)
		for i := range out {
			out[i] = config.Token(rng.IntN(32000))
		}
		return out
	}
	var reqs []demoRequest
	for g := range f.groups {
		system := tokens(f.systemTokens)
		for range f.perGroup {
			lo := max(f.questionTokens/2, 1)
			q := tokens(lo + rng.IntN(f.questionTokens+f.questionTokens/2-lo+1))
			prompt := append(append(make([]config.Token, 0, len(system)+len(q)), system...), q...)
			reqs = append(reqs, demoRequest{fakeengine.Request{Prompt: prompt, OutputLen: f.outputTokens}, g})
		}
	}
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	return reqs
}

func runDemo(f *demoFlags, stdout, stderr io.Writer) int {
	if err := f.validate(); err != nil {
		fmt.Fprintf(stderr, "kvcm demo: %v\n", err)
		return exitUsage
	}
	if err := f.shared.validate(); err != nil {
		fmt.Fprintf(stderr, "kvcm demo: %v\n", err)
		return exitUsage
	}
	if f.shared.addrs != "" {
		return runSharedDemo(f, stdout, stderr)
	}
	if err := demo(f, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "kvcm demo: %v\n", err)
		return exitFail
	}
	return exitOK
}

// errMismatch reports that the integrity check failed; demo has printed it.
var errMismatch = errors.New("KV integrity check failed")

func demo(f *demoFlags, stdout, stderr io.Writer) (err error) {
	diskPath := f.diskPath
	if f.diskQuota > 0 && diskPath == "" {
		if diskPath, err = os.MkdirTemp("", "kvcm-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(diskPath)
	}
	cfg := f.config(diskPath)
	dev, err := backend.OpenWith(f.device, backend.Options{Emu: emu.Options{Seed: f.seed, MaxDelay: f.maxDelay}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.Close()) }()
	opts := []core.Option{core.WithDevice(dev)}
	var auto *gpucodec.Auto
	if staging, ok := demoStaging[f.codec]; ok {
		if auto, err = gpucodec.NewAutoWith(dev, gpucodec.AutoOptions{Staging: staging}); err != nil {
			return err
		}
		opts = append(opts, core.WithColdPageCodec(codec.Own(auto)))
	}
	m, err := core.NewManager(cfg, opts...)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	e, err := fakeengine.New(m, cfg, fakeengine.Options{Seed: uint64(f.seed), ChunkTokens: f.chunk})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	stream, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stream.Close()) }()

	reqs := f.workload()
	st, err := m.StorageStats(layout.GPULevel)
	if err != nil {
		return err
	}
	f.printHeader(stdout, e, st, len(reqs))
	fmt.Fprintf(stdout, "device: %s; codec: %s\n", describeDevice(dev, f.maxDelay), describeCodec(m, auto))

	showBar := f.progress == "always" || (f.progress == "auto" && isTerminal(stderr))
	bar := newProgress(stderr, showBar, "serving", "requests", len(reqs))
	tpb := f.tokensPerBlock
	seen := make([]bool, f.groups) // groups served at least once
	var promptTokens, reusedTokens, idealTokens, computedTokens int64
	account := func(req demoRequest, reused, generated int) {
		promptTokens += int64(len(req.Prompt))
		reusedTokens += int64(reused)
		computedTokens += int64(len(req.Prompt) + generated - reused)
		// With unlimited memory every request but its group's first reuses
		// the whole blocks of the system prompt.
		if seen[req.group] {
			idealTokens += int64(f.systemTokens / tpb * tpb)
		}
		seen[req.group] = true
	}
	serve := func(i int) error {
		if err := f.squeeze(m, i, len(reqs)); err != nil {
			return err
		}
		res, err := e.Serve(stream, reqs[i].Request)
		if err != nil {
			return fmt.Errorf("request %d of %d: %w", i+1, len(reqs), err)
		}
		account(reqs[i], res.Reused, reqs[i].OutputLen)
		bar.set(i + 1)
		return nil
	}
	start := time.Now()
	for i := 0; i < len(reqs); i++ {
		if i%demoPreemptEvery != demoPreemptEvery-1 || i+demoPreemptSpan >= len(reqs) {
			if err := serve(i); err != nil {
				bar.finish()
				return err
			}
			continue
		}
		// Preempt this request after one step while the next ones run.
		if err := f.squeeze(m, i, len(reqs)); err != nil {
			bar.finish()
			return err
		}
		first := i
		reused, err := preempted(e, m, stream, reqs[i].Request, func() error {
			for j := first + 1; j <= first+demoPreemptSpan; j++ {
				if err := serve(j); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			bar.finish()
			return fmt.Errorf("request %d of %d (preempted): %w", i+1, len(reqs), err)
		}
		account(reqs[i], reused, reqs[i].OutputLen)
		i += demoPreemptSpan
		bar.set(i + 1)
	}
	elapsed := time.Since(start)
	bar.finish()

	ms := m.Stats()
	es := e.Stats()
	fmt.Fprintf(stdout, "requests served: %d\n", len(reqs))
	fmt.Fprintf(stdout, "reuse hit ratio: %.1f%% of prompt blocks (%d of %d, BlockStats.HitRate); %.1f%% of prompt tokens (%d of %d; %.1f%% with unlimited GPU memory)\n",
		100*ms.HitRate(), ms.ReusedBlocks, ms.ReusedBlocks+ms.MissedBlocks,
		pct(reusedTokens, promptTokens), reusedTokens, promptTokens, pct(idealTokens, promptTokens))
	fmt.Fprintf(stdout, "evictions: %d pages\n", ms.Evictions)
	printMigrations(stdout, m.MigrationStats())
	fmt.Fprintf(stdout, "throughput: %.1f requests/s, %.0f computed tokens/s (%v)\n",
		float64(len(reqs))/elapsed.Seconds(), float64(computedTokens)/elapsed.Seconds(), elapsed.Round(time.Millisecond))
	if es.FirstMismatch != nil {
		fmt.Fprintf(stderr, "kvcm demo: first mismatch: %v\n", es.FirstMismatch)
	}
	fmt.Fprintf(stdout, "integrity: %d pages verified, %d mismatches\n", es.PagesVerified, es.Mismatches)
	if es.Mismatches > 0 {
		return errMismatch
	}
	return nil
}

func (f *demoFlags) printHeader(w io.Writer, e *fakeengine.Engine, st []core.PoolGroupStats, n int) {
	fmt.Fprintf(w, "kvcm demo: %d requests = %d groups x %d, system prompt %d + question %d..%d tokens, %d output tokens; seed %d\n",
		n, f.groups, f.perGroup, f.systemTokens, max(f.questionTokens/2, 1), f.questionTokens+f.questionTokens/2,
		f.outputTokens, f.seed)
	layers := "all attend fully"
	if f.window > 0 {
		layers = fmt.Sprintf("%d full attention, %d with a %d-token window", demoFullLayers, demoWindowLayers, f.window)
	}
	fmt.Fprintf(w, "model: %d layers (%s), %s of KV per token, %d tokens per block\n",
		demoFullLayers+demoWindowLayers, layers, formatBytes(e.TokenBytes()), f.tokensPerBlock)
	groups := ""
	for i, g := range st {
		if i > 0 {
			groups += " + "
		}
		groups += fmt.Sprintf("%d slots of %s", g.Total, formatBytes(g.PageBytes))
	}
	fmt.Fprintf(w, "gpu: %s quota = %s; host %s, disk %s\n",
		formatBytes(int64(f.gpuQuota)), groups, formatBytes(int64(f.hostQuota)), formatBytes(int64(f.diskQuota)))
}

// describeDevice names the device the demo runs on.
func describeDevice(d device.Device, maxDelay time.Duration) string {
	if p, ok := d.(interface{ Properties() cuda.Properties }); ok {
		pr := p.Properties()
		return fmt.Sprintf("cuda %d (%s, sm_%d%d, driver %d.%d)", pr.Ordinal, pr.Name, pr.ComputeMajor, pr.ComputeMinor,
			pr.DriverVersion/1000, pr.DriverVersion%1000/10)
	}
	return fmt.Sprintf("emulated, max delay %v", maxDelay)
}

// describeCodec says how each layer group's cold pages move.
func describeCodec(m *core.Manager, auto *gpucodec.Auto) string {
	if auto == nil {
		return "default (DMA)"
	}
	out := "auto ("
	for lg := range m.NumLayerGroups() {
		c, _ := auto.Choice(layout.LayerGroupID(lg))
		if lg > 0 {
			out += ", "
		}
		out += fmt.Sprintf("layer group %d: %v", lg, c)
	}
	return out + ")"
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// Every demoPreemptEvery-th request is preempted after its first step while
// the next demoPreemptSpan requests run: long enough for its pages to be
// pushed past the host tier to disk.
const (
	demoPreemptEvery = 16
	demoPreemptSpan  = 12
)

// preempted runs req the way an engine preempts a request: one step, then
// suspended while other work runs (between), its pages prefetched back to the
// host tier, then resumed (and its pages verified) and finished.
func preempted(e *fakeengine.Engine, m *core.Manager, stream device.Stream, req fakeengine.Request, between func() error) (reused int, err error) {
	s, err := e.Start(req)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	if _, err := s.Resume(stream); err != nil {
		return 0, err
	}
	if _, err := s.Advance(); err != nil {
		return 0, err
	}
	if err := s.Suspend(); err != nil {
		return 0, err
	}
	if err := between(); err != nil {
		return 0, err
	}
	if len(m.Layout().Levels) > 1 {
		if err := s.Cache().Prefetch(1); err != nil && !errors.Is(err, core.ErrOutOfPages) {
			return 0, err
		}
	}
	if _, err := s.Resume(stream); err != nil {
		return 0, err
	}
	for done := false; !done; {
		if done, err = s.Advance(); err != nil {
			return 0, err
		}
	}
	return s.Reused(), nil
}

// squeeze plays an operator reclaiming memory: at a third and at two thirds
// of the run the GPU tier is halved and restored (evicting and
// defragmenting), and the host tier is cut to a sixty-fourth for a few
// requests, so evictions skip it and go straight to disk.
func (f *demoFlags) squeeze(m *core.Manager, i, n int) error {
	for _, at := range []int{n / 3, 2 * n / 3} {
		switch {
		case i == at:
			q := int64(f.gpuQuota)
			if err := m.ResizeLevel(layout.GPULevel, q/2); err != nil {
				return fmt.Errorf("shrink the gpu tier: %w", err)
			}
			if err := m.ResizeLevel(layout.GPULevel, q); err != nil {
				return fmt.Errorf("grow the gpu tier back: %w", err)
			}
			if f.hostQuota > 0 && f.diskQuota > 0 {
				if err := m.ResizeLevel(1, int64(f.hostQuota)/64); err != nil {
					return fmt.Errorf("shrink the host tier: %w", err)
				}
			}
		case i == at+4 && f.hostQuota > 0 && f.diskQuota > 0:
			if err := m.ResizeLevel(1, int64(f.hostQuota)); err != nil {
				return fmt.Errorf("grow the host tier back: %w", err)
			}
		}
	}
	return nil
}

func printMigrations(w io.Writer, stats map[core.Path]core.MigrationCounter) {
	fmt.Fprintf(w, "migrations:\n  %-10s %10s %12s\n", "path", "pages", "bytes")
	for _, p := range core.Paths() {
		c := stats[p]
		fmt.Fprintf(w, "  %-10s %10d %12s\n", p, c.Pages, formatBytes(c.Bytes))
	}
}
