package bookkeeping

import (
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"slices"
	"syscall"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/internal/bench/stats"
)

const (
	tokensPerBlock = 32
	numLayers      = 4
	// pageBytes is one page of the benchmark's model: numLayers layers of
	// a key and a value buffer of one byte a token.
	pageBytes = numLayers * 2 * tokensPerBlock
	vocab     = 32000
)

// Config selects what Run measures.
type Config struct {
	// Prompts are the prompt sizes of the trace, in tokens.
	Prompts []int
	// Requests is how many requests one round runs per prompt size and
	// pressure.
	Requests int
	// Rounds is how many interleaved rounds are run; medians are reported.
	Rounds int
	// DecodeSteps is the decode steps of each request, and of each timed
	// run of the decode-step table.
	DecodeSteps int
	// HeldTokens are the cache sizes of the decode-step table.
	HeldTokens []int
	// Window is the sliding window, in tokens, of the windowed model's
	// windowed layers.
	Window int
	// BlockKeys are the block key algorithms the trace runs with; every
	// ratio is against SHA-256 hashing of the same blocks.
	BlockKeys []blockhash.Algorithm
	// Forms are the ways the decode steps reach the manager; the first is
	// the reference of the forms' ratios.
	Forms []StepForm
}

// StepForm is how a decode step (resize by one token, commit it) reaches
// the manager.
type StepForm int

const (
	// PerStep is the trace's form: Resize then Commit, two calls a step.
	PerStep StepForm = iota
	// OneCallPerStep is DecodeSteps with one token: one call a step.
	OneCallPerStep
	// OneCallPerBlock is the engine form: the steps of a block gathered
	// into one DecodeSteps, called when the step fills the block (or is
	// the last), as the Python binding's deferral does.
	OneCallPerBlock
)

func (f StepForm) String() string {
	switch f {
	case PerStep:
		return "per-step calls"
	case OneCallPerStep:
		return "DecodeSteps, 1 token a call"
	case OneCallPerBlock:
		return "DecodeSteps, one call a block"
	}
	return fmt.Sprintf("StepForm(%d)", int(f))
}

// DefaultConfig is the trace of issue 11.
func DefaultConfig() Config {
	return Config{
		Prompts: []int{1 << 10, 8 << 10, 32 << 10}, Requests: 32, Rounds: 5,
		DecodeSteps: 128, HeldTokens: []int{1 << 10, 128 << 10}, Window: 1 << 10,
		BlockKeys: []blockhash.Algorithm{blockhash.SHA256, blockhash.XXH3},
		Forms:     []StepForm{PerStep, OneCallPerStep, OneCallPerBlock},
	}
}

func (c Config) validate() error {
	switch {
	case len(c.Prompts) == 0:
		return fmt.Errorf("bookkeeping: no prompt sizes")
	case len(c.BlockKeys) == 0:
		return fmt.Errorf("bookkeeping: no block keys")
	case len(c.Forms) == 0:
		return fmt.Errorf("bookkeeping: no decode step forms")
	case c.Requests < 2:
		return fmt.Errorf("bookkeeping: requests must be at least 2, got %d", c.Requests)
	case c.Rounds < 1:
		return fmt.Errorf("bookkeeping: rounds must be positive, got %d", c.Rounds)
	case c.DecodeSteps < 1:
		return fmt.Errorf("bookkeeping: decode steps must be positive, got %d", c.DecodeSteps)
	case c.Window < tokensPerBlock:
		return fmt.Errorf("bookkeeping: window must be at least one block (%d tokens), got %d", tokensPerBlock, c.Window)
	}
	for _, p := range append(slices.Clone(c.Prompts), c.HeldTokens...) {
		if p < 2*tokensPerBlock {
			return fmt.Errorf("bookkeeping: sizes must be at least %d tokens, got %d", 2*tokensPerBlock, p)
		}
	}
	return nil
}

// RequestResult is the trace's figures for one prompt size and pressure.
type RequestResult struct {
	Prompt   int
	Pressure bool
	Key      blockhash.Algorithm
	Form     StepForm
	// CPU time per request and of hashing its prompt's blocks, medians.
	RequestCPU, HashCPU time.Duration
	// Allocs per request (median round).
	Allocs float64
	// GCShare is the garbage collector's share of the Go runtime's busy CPU
	// time while the requests ran (median round), as runtime/metrics
	// accounts it: /cpu/classes/gc/total over /cpu/classes/total less
	// /cpu/classes/idle.
	GCShare float64
	// Evictions per request (median round).
	Evictions float64
	// Reused tokens per request, averaged over the trace.
	Reused float64
	// NewBlocks is the blocks per request that got a new page (prompt and
	// decode steps less the reused blocks), averaged over the trace.
	NewBlocks float64
}

// AllocsPerNewBlock is the allocations per request over its new blocks
// (issue 11's target 2 for prefill: at most one).
func (r RequestResult) AllocsPerNewBlock() float64 { return r.Allocs / r.NewBlocks }

// Ratio is the request's CPU time over the SHA-256 hashing of its prompt.
func (r RequestResult) Ratio() float64 { return float64(r.RequestCPU) / float64(r.HashCPU) }

// StepResult is the decode-step cost for one model and one cache size.
type StepResult struct {
	Model  string
	Form   StepForm
	Held   int
	Step   time.Duration
	Allocs float64
}

// Results are everything Run measured.
type Results struct {
	Requests []RequestResult
	Steps    []StepResult
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err) // cannot fail for RUSAGE_SELF
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runtimeCPU is the garbage collector's and all busy CPU time so far, in
// seconds, as runtime/metrics accounts them.
func runtimeCPU() (gc, busy float64) {
	s := []metrics.Sample{
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"},
		{Name: "/cpu/classes/idle:cpu-seconds"},
	}
	metrics.Read(s)
	return s[0].Value.Float64(), s[1].Value.Float64() - s[2].Value.Float64()
}

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// model returns the benchmark's configuration with slots GPU pages and
// block key key; with a window, half of the layers slide over window tokens.
func model(slots int64, window int, key blockhash.Algorithm) config.Config {
	kv := []config.BufferConfig{{Role: config.RoleKey, Size: tokensPerBlock}, {Role: config.RoleValue, Size: tokensPerBlock}}
	cfg := config.Config{
		TokensPerBlock:   tokensPerBlock,
		CacheTiers:       []config.CacheTierConfig{config.GPU(slots * pageBytes)},
		MaxUtilForResume: 1,
		BlockKey:         key,
	}
	for l := range numLayers {
		lc := config.AttentionLayerConfig{LayerID: int32(l), Buffers: kv}
		if window > 0 && l%2 == 1 {
			lc.SlidingWindowSize = window
		}
		cfg.Layers = append(cfg.Layers, lc)
	}
	return cfg
}

// rig is one manager on its own emulated device.
type rig struct {
	dev    *emu.Device
	m      *core.Manager
	stream device.Stream
}

func newRig(slots int64, window int, key blockhash.Algorithm) (*rig, error) {
	r := &rig{dev: emu.New(emu.Options{})}
	var err error
	if r.m, err = core.NewManager(model(slots, window, key), core.WithDevice(r.dev)); err != nil {
		r.dev.Close()
		return nil, err
	}
	if r.stream, err = r.dev.NewStream(); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *rig) close() error {
	if r.stream != nil {
		r.stream.Close()
	}
	err := r.m.Close()
	r.dev.Close()
	return err
}

// trace returns n prompts of size tokens: every odd one shares the first
// half of the one before.
func trace(rng *rand.Rand, n, size int) [][]config.Token {
	out := make([][]config.Token, n)
	for i := range out {
		p := make([]config.Token, size)
		start := 0
		if i%2 == 1 {
			start = copy(p, out[i-1][:size/2])
		}
		for j := start; j < size; j++ {
			p[j] = config.Token(rng.IntN(vocab))
		}
		out[i] = p
	}
	return out
}

// request runs one request of the trace and returns the tokens it reused.
func (r *rig) request(prompt []config.Token, steps int, next config.Token, form StepForm) (int, error) {
	c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: prompt})
	if err != nil {
		return 0, err
	}
	reused := c.ReusedTokens()
	if err := r.prefill(c, prompt); err != nil {
		c.Close()
		return 0, err
	}
	if err := decode(c, len(prompt), steps, next, form); err != nil {
		c.Close()
		return 0, err
	}
	return reused, c.Close()
}

func (r *rig) prefill(c *core.KVCache, prompt []config.Token) error {
	if err := c.Resume(r.stream); err != nil {
		return err
	}
	if err := c.Resize(len(prompt), len(prompt)); err != nil {
		return err
	}
	return c.Commit(prompt[c.ReusedTokens():], false)
}

// decode runs steps one-token decode steps on a cache of n tokens, in the
// given form.
func decode(c *core.KVCache, n, steps int, next config.Token, form StepForm) error {
	var buf [tokensPerBlock]config.Token
	for s := 0; s < steps; {
		switch form {
		case PerStep:
			if err := c.Resize(n+s+1, n+s+1); err != nil {
				return err
			}
			buf[0] = next + config.Token(s)
			if err := c.Commit(buf[:1], false); err != nil {
				return err
			}
			s++
		case OneCallPerStep:
			buf[0] = next + config.Token(s)
			if err := c.DecodeSteps(buf[:1]); err != nil {
				return err
			}
			s++
		default: // OneCallPerBlock: up to the step that fills the block
			k := 0
			for s < steps {
				buf[k] = next + config.Token(s)
				k, s = k+1, s+1
				if (n+s)%tokensPerBlock == 0 {
					break
				}
			}
			if err := c.DecodeSteps(buf[:k]); err != nil {
				return err
			}
		}
	}
	return nil
}

// hashPrompts hashes the full blocks of every prompt as the manager keys
// them and returns a value that depends on every key.
func hashPrompts(h *blockhash.Hasher, prompts [][]config.Token) blockhash.Key {
	var acc blockhash.Key
	root := blockhash.Scope{}.Root()
	for _, p := range prompts {
		k := root
		for i := 0; i+tokensPerBlock <= len(p); i += tokensPerBlock {
			k = h.Next(k, p[i:i+tokensPerBlock])
		}
		acc ^= k
	}
	return acc
}

type roundResult struct {
	request, hash     time.Duration
	allocs, evictions float64
	gcShare           float64
	reused, newBlocks float64
}

// runTrace runs one round of the trace for one prompt size, pressure, block
// key and decode step form on a fresh manager; h hashes the reference
// (SHA-256).
func runTrace(cfg Config, prompts [][]config.Token, pressure bool, key blockhash.Algorithm, form StepForm, h *blockhash.Hasher) (roundResult, error) {
	size := len(prompts[0])
	perRequest := int64(size+cfg.DecodeSteps)/tokensPerBlock + 2
	slots := perRequest*int64(len(prompts)) + 8
	if pressure {
		slots = 2*perRequest + 8
	}
	r, err := newRig(slots, 0, key)
	if err != nil {
		return roundResult{}, err
	}
	var res roundResult
	runtime.GC()
	before := r.m.Stats()
	gc, busy := runtimeCPU()
	allocs, start := mallocs(), cpuTime()
	reused, newBlocks := 0, 0
	for i, p := range prompts {
		n, err := r.request(p, cfg.DecodeSteps, config.Token(vocab+i*cfg.DecodeSteps), form)
		if err != nil {
			r.close()
			return roundResult{}, fmt.Errorf("request %d of %d tokens: %w", i, size, err)
		}
		reused += n
		newBlocks += (len(p)+cfg.DecodeSteps+tokensPerBlock-1)/tokensPerBlock - n/tokensPerBlock
	}
	res.request = (cpuTime() - start) / time.Duration(len(prompts))
	gc2, busy2 := runtimeCPU()
	if busy2 > busy {
		res.gcShare = (gc2 - gc) / (busy2 - busy)
	}
	res.allocs = float64(mallocs()-allocs) / float64(len(prompts))
	res.evictions = float64(r.m.Stats().Evictions-before.Evictions) / float64(len(prompts))
	res.reused = float64(reused) / float64(len(prompts))
	res.newBlocks = float64(newBlocks) / float64(len(prompts))
	if err := r.close(); err != nil {
		return roundResult{}, err
	}
	start = cpuTime()
	// Hash the trace often enough that the CPU clock resolves it.
	reps := 0
	var sink blockhash.Key
	for reps == 0 || cpuTime()-start < 20*time.Millisecond {
		sink ^= hashPrompts(h, prompts)
		reps++
	}
	res.hash = (cpuTime() - start) / time.Duration(reps*len(prompts))
	if sink == 1 {
		fmt.Print("") // keeps the hashing from being optimized away
	}
	return res, nil
}

// runSteps times decode steps on one cache per size of HeldTokens, each on
// a fresh manager, alternating runs of DecodeSteps steps between the sizes so
// that every size sees the same machine. It returns the CPU time and the
// allocations per step, per size, with the decode steps in the given form.
func runSteps(cfg Config, rng *rand.Rand, window int, form StepForm) ([]time.Duration, []float64, error) {
	const reps = 32
	warm := 2 * cfg.DecodeSteps
	type sized struct {
		r    *rig
		c    *core.KVCache
		n    int
		cpu  time.Duration
		allc uint64
	}
	all := make([]*sized, len(cfg.HeldTokens))
	defer func() {
		for _, s := range all {
			if s != nil {
				s.c.Close()
				s.r.close()
			}
		}
	}()
	for i, held := range cfg.HeldTokens {
		slots := int64(held+warm+reps*cfg.DecodeSteps)/tokensPerBlock + 8
		r, err := newRig(slots, window, blockhash.SHA256)
		if err != nil {
			return nil, nil, err
		}
		prompt := trace(rng, 1, held)[0]
		c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: prompt})
		if err != nil {
			r.close()
			return nil, nil, err
		}
		all[i] = &sized{r: r, c: c, n: held}
		if err := r.prefill(c, prompt); err != nil {
			return nil, nil, err
		}
		// Untimed steps first, so the cache's slices have grown past the
		// timed ones (their growth is amortized over as many blocks as the
		// cache holds, more than the timed steps add).
		if err := decode(c, held, warm, vocab, form); err != nil {
			return nil, nil, err
		}
		all[i].n += warm
	}
	runtime.GC()
	for range reps {
		for _, s := range all {
			allocs, start := mallocs(), cpuTime()
			if err := decode(s.c, s.n, cfg.DecodeSteps, vocab, form); err != nil {
				return nil, nil, err
			}
			s.cpu += cpuTime() - start
			s.allc += mallocs() - allocs
			s.n += cfg.DecodeSteps
		}
	}
	steps := reps * cfg.DecodeSteps
	cpu := make([]time.Duration, len(all))
	allocs := make([]float64, len(all))
	for i, s := range all {
		cpu[i] = s.cpu / time.Duration(steps)
		allocs[i] = float64(s.allc) / float64(steps)
	}
	return cpu, allocs, nil
}

// Run measures cfg's trace and decode steps, reporting progress to log.
func Run(cfg Config, log io.Writer) (Results, error) {
	if err := cfg.validate(); err != nil {
		return Results{}, err
	}
	rng := rand.New(rand.NewPCG(11, 1))
	h := blockhash.NewHasher()
	type cell struct {
		prompt, trace int
		pressure      bool
		key           blockhash.Algorithm
		form          StepForm
	}
	var cells []cell
	for i, p := range cfg.Prompts {
		for _, k := range cfg.BlockKeys {
			for _, pressure := range []bool{false, true} {
				for _, f := range cfg.Forms {
					cells = append(cells, cell{p, i, pressure, k, f})
				}
			}
		}
	}
	traces := make([][][]config.Token, len(cfg.Prompts))
	for i, p := range cfg.Prompts {
		traces[i] = trace(rng, cfg.Requests, p)
	}
	rounds := make([][]roundResult, len(cells))
	models := []struct {
		name   string
		window int
	}{{"full attention", 0}, {fmt.Sprintf("half the layers in a %d-token window", cfg.Window), cfg.Window}}
	type stepRound struct {
		step   time.Duration
		allocs float64
	}
	nf, nh := len(cfg.Forms), len(cfg.HeldTokens)
	steps := make([][]stepRound, len(models)*nf*nh)
	for round := range cfg.Rounds {
		fmt.Fprintf(log, "bench bookkeeping: round %d of %d\n", round+1, cfg.Rounds)
		for i, c := range cells {
			res, err := runTrace(cfg, traces[c.trace], c.pressure, c.key, c.form, h)
			if err != nil {
				return Results{}, err
			}
			rounds[i] = append(rounds[i], res)
		}
		for mi, md := range models {
			for fi, f := range cfg.Forms {
				st, al, err := runSteps(cfg, rng, md.window, f)
				if err != nil {
					return Results{}, fmt.Errorf("decode steps (%s, %v): %w", md.name, f, err)
				}
				for hi := range cfg.HeldTokens {
					k := (mi*nf+fi)*nh + hi
					steps[k] = append(steps[k], stepRound{st[hi], al[hi]})
				}
			}
		}
	}
	var out Results
	for i, c := range cells {
		rs := rounds[i]
		mr := stats.MedianBy(rs, func(r roundResult) float64 { return float64(r.request) })
		mh := stats.MedianBy(rs, func(r roundResult) float64 { return float64(r.hash) })
		ma := stats.MedianBy(rs, func(r roundResult) float64 { return r.allocs })
		mg := stats.MedianBy(rs, func(r roundResult) float64 { return r.gcShare })
		out.Requests = append(out.Requests, RequestResult{
			Prompt: c.prompt, Pressure: c.pressure, Key: c.key, Form: c.form, RequestCPU: mr.request, HashCPU: mh.hash,
			Allocs: ma.allocs, GCShare: mg.gcShare, Evictions: mr.evictions, Reused: mr.reused,
			NewBlocks: mr.newBlocks,
		})
	}
	for mi, md := range models {
		for fi, f := range cfg.Forms {
			for hi, held := range cfg.HeldTokens {
				rs := steps[(mi*nf+fi)*nh+hi]
				ms := stats.MedianBy(rs, func(r stepRound) float64 { return float64(r.step) })
				ma := stats.MedianBy(rs, func(r stepRound) float64 { return r.allocs })
				out.Steps = append(out.Steps, StepResult{Model: md.name, Form: f, Held: held, Step: ms.step, Allocs: ma.allocs})
			}
		}
	}
	return out, nil
}
