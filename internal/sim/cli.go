package sim

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/kvcm/kvcm/core/sched"
)

// CLI holds the flags of `kvcm simulate`. Register them on a flag set, then
// call Run.
type CLI struct {
	workloads, policies, loads string
	seeds                      int
	seedBase                   uint64
	full                       bool
	grid                       string
	shrink                     int
	jsonOut, markdown          bool
	fromJSON                   string
	plots, plotFormat          string
	cdfLoad                    float64
	tracePath, writeTrace      string
	index                      string
	capacity                   int64
	workers                    int
	tiers                      Tiers
	saturation                 string
	opts                       Options
	fs                         *flag.FlagSet
}

// Full-matrix defaults (--full): the command that produced docs/scheduling.md.
const (
	FullWorkloads = "w1,w2:0:0.25,w2:0.8:0.25,w2:1.2:0.25,w2:0:0.5,w2:0.8:0.5,w2:1.2:0.5,w4,w5,rag"
	FullLoads     = "0.3,0.5,0.7,0.85,0.95"
	FullSeeds     = 5
	// DefaultPolicies are the five policies of EVALUATION.md §3 and the
	// recommended default, aged:64 (sched.Default).
	DefaultPolicies = "fcfs,lpm:128,klpm:4,window:64,aged:64,resort"
)

// The tiers grid (--grid tiers): issue 18's workloads, loads, seeds and
// variants; flags given explicitly override each part.
const (
	TiersGridWorkloads = "w1,w2:0.8:0.25,w4,w5,rag"
	TiersGridLoads     = "0.7,0.85,0.95"
	TiersGridSeeds     = 5
	TiersGridPolicies  = "fcfs,fcfs@tiered,aged:64@tiered,fcfs@tiered+prefetch+qevict," +
		"aged:64@tiered+prefetch+qevict,aged:64@tiered+prefetch+qevict+recompute," +
		"fcfs@tiered+reuse,aged:64@tiered+prefetch+qevict+reuse," +
		"fcfs@tiered+reuse+overlap,aged:64@tiered+prefetch+qevict+reuse+overlap"
)

// Register defines the flags on fs.
func (c *CLI) Register(fs *flag.FlagSet) {
	c.opts = DefaultOptions()
	c.fs = fs
	d := c.opts.Cost
	fs.StringVar(&c.workloads, "workloads", "w2:0.8:0.25,w5", "comma-separated workloads: w1, w2:ALPHA:CAPACITY (Zipf alpha, capacity as a fraction of the distinct-prefix footprint), w4, w5, rag")
	fs.StringVar(&c.policies, "policies", DefaultPolicies, "comma-separated policies: fcfs, lpm[:scancap], klpm:K[:scancap], window:N, aged:N[:f], resort; each may end in @gpu (the default) or @tiered (host and disk levels, --host-capacity, --disk-capacity), then, in this order, +prefetch (tiered only), +qevict (queue-aware eviction), +reuse (reuse-aware eviction: blocks nobody reused go first, popular ones last), then +overlap (tiered only: recompute a run of a cold prefix on the GPU while the blocks after it are read, the run sized so both finish together, counting the delay to others) or +recompute (tiered only: recompute a cold prefix where reading it would take longer, counting the delay to others), e.g. aged:64@tiered+prefetch+qevict")
	fs.StringVar(&c.loads, "loads", "0.85,0.95", "comma-separated loads, as fractions of each workload's FCFS saturation throughput")
	fs.IntVar(&c.seeds, "seeds", 3, "number of seeds (traces) per point")
	fs.Uint64Var(&c.seedBase, "seed-base", 1, "first seed")
	fs.BoolVar(&c.full, "full", false, "the full matrix: workloads "+FullWorkloads+", loads "+FullLoads+", "+strconv.Itoa(FullSeeds)+" seeds (about 35 minutes on 2 cores)")
	fs.StringVar(&c.grid, "grid", "", "a preset grid: tiers (workloads "+TiersGridWorkloads+", loads "+TiersGridLoads+", "+strconv.Itoa(TiersGridSeeds)+" seeds, policies "+TiersGridPolicies+"); --workloads, --loads, --seeds and --policies given explicitly override it")
	fs.IntVar(&c.shrink, "shrink", 1, "divide every workload's request count by this (a quick look at the same shape)")
	fs.BoolVar(&c.jsonOut, "json", false, "write the report as JSON on stdout instead of tables")
	fs.BoolVar(&c.markdown, "markdown", false, "write the tables as Markdown")
	fs.StringVar(&c.fromJSON, "from-json", "", "comma-separated JSON reports (from --json) to print (and plot, with --plots) again instead of simulating")
	fs.StringVar(&c.plots, "plots", "", "write SVG plots (TTFT CDF per policy, TTFT mean and p99 vs load) into this directory")
	fs.StringVar(&c.plotFormat, "plot-format", "svg", "format of the plots: "+strings.Join(PlotFormats, ", "))
	fs.Float64Var(&c.cdfLoad, "cdf-load", 0.85, "load of the TTFT CDF plots (the nearest one run)")
	fs.StringVar(&c.tracePath, "trace", "", "replay these comma-separated JSONL traces, one a seed, instead of generated workloads (loads relative to their FCFS saturation; not with --workloads, --seeds, --seed-base, --shrink or --full)")
	fs.StringVar(&c.writeTrace, "write-trace", "", "write the first workload's trace as JSONL to this file, and exit: the first seed's, or every seed's where the name contains {seed}")
	fs.StringVar(&c.index, "index", string(IndexManager), "CP-aware index: manager (the manager-backed one), null, none")
	fs.Int64Var(&c.capacity, "capacity", 0, "KV capacity in tokens for every workload (0: each workload's own)")
	fs.IntVar(&c.workers, "workers", 0, "simulations run at once, longest first (0: one per CPU)")
	fs.IntVar(&c.workers, "j", 0, "same as --workers")
	fs.IntVar(&c.opts.TokenBudget, "budget", c.opts.TokenBudget, "token budget per step")
	fs.IntVar(&c.opts.MaxBatch, "max-batch", c.opts.MaxBatch, "most requests running at once")
	fs.IntVar(&c.opts.TokensPerBlock, "block", c.opts.TokensPerBlock, "tokens per KV block")
	fs.Float64Var(&c.opts.Warmup, "warmup", c.opts.Warmup, "fraction of requests (in arrival order) dropped as warm-up")
	fs.Float64Var(&c.opts.Cost.T0, "t0", d.T0, "prefill step fixed cost (s)")
	fs.Float64Var(&c.opts.Cost.Beta, "beta", d.Beta, "prefill cost per uncached token (s)")
	fs.Float64Var(&c.opts.Cost.Gamma, "gamma", d.Gamma, "prefill attention cost per uncached token per context token (s)")
	fs.Float64Var(&c.opts.Cost.D0, "d0", d.D0, "decode step fixed cost (s)")
	fs.Float64Var(&c.opts.Cost.D1, "d1", d.D1, "decode cost per running request (s)")
	fs.Float64Var(&c.opts.Cost.D2, "d2", d.D2, "decode cost per context token (s)")
	fs.StringVar(&c.saturation, "saturation", "fcfs", "the FCFS variant whose backlog throughput defines the load: fcfs (on the GPU tier) or fcfs@tiered")
	c.tiers = DefaultTiers()
	fs.Float64Var(&c.tiers.HostX, "host-capacity", c.tiers.HostX, "host level of @tiered variants, as a multiple of the GPU capacity (0: none)")
	fs.Float64Var(&c.tiers.DiskX, "disk-capacity", c.tiers.DiskX, "disk level of @tiered variants, as a multiple of the GPU capacity (0: none)")
	fs.StringVar(&c.tiers.DiskDir, "disk-dir", "", "directory of the disk level's files (default: a temporary one per run)")
	l := c.opts.Link
	fs.Float64Var(&c.opts.Link.BytesPerToken, "kv-bytes-per-token", l.BytesPerToken, "modelled KV bytes a token, all layers, that the link moves")
	fs.Float64Var(&c.opts.Link.H2D, "pcie-h2d", l.H2D, "host→GPU GB/s, one direction alone (docs/benchmarks.md, H200)")
	fs.Float64Var(&c.opts.Link.D2H, "pcie-d2h", l.D2H, "GPU→host GB/s, one direction alone (docs/benchmarks.md, H200)")
	fs.Float64Var(&c.opts.Link.Duplex, "pcie-duplex", l.Duplex, "GB/s of both PCIe directions at once, in total (not measured: an assumption)")
	fs.Float64Var(&c.opts.Link.DiskRead, "disk-read", l.DiskRead, "disk read GB/s (docs/benchmarks.md, disk→gpu at 2 MiB)")
	fs.Float64Var(&c.opts.Link.DiskWrite, "disk-write", l.DiskWrite, "disk write GB/s (docs/benchmarks.md, gpu→disk at 2 MiB)")
	p := c.opts.Prefetch
	fs.Float64Var(&c.opts.Prefetch.Pages, "prefetch-pages", p.Pages, "@tiered+prefetch: most GPU pages, as a fraction of the GPU capacity, prefetched for waiting requests")
	fs.Float64Var(&c.opts.Prefetch.Horizon, "prefetch-horizon", p.Horizon, "@tiered+prefetch: no prefetch while the host→GPU link is busy more than this many seconds ahead")
	q := c.opts.QueueEvict
	fs.Float64Var(&c.opts.QueueEvict.Limit, "qevict-limit", q.Limit, "+qevict: most blocks raised for waiting requests at once, as a fraction of the GPU capacity")
	fs.IntVar(&c.opts.QueueEvict.Priority, "qevict-priority", q.Priority, "+qevict: eviction priority of blocks waiting requests will reuse (above the default 35, at most 100)")
	ru := c.opts.ReuseEvict
	fs.Float64Var(&c.opts.ReuseEvict.Limit, "reuse-limit", ru.Limit, "+reuse: most blocks ranked above the default priority at once, as a multiple of the GPU capacity")
	fs.IntVar(&c.opts.ReuseEvict.HalfLife, "reuse-half-life", ru.HalfLife, "+reuse: admissions it takes a block's reuse count to halve")
}

// Matrix builds the experiment from the parsed flags.
func (c *CLI) Matrix() (Matrix, error) {
	wl, loads, seeds, policies := c.workloads, c.loads, c.seeds, c.policies
	if c.full {
		wl, loads, seeds = FullWorkloads, FullLoads, max(seeds, FullSeeds)
	}
	var mx Matrix
	switch c.grid {
	case "":
	case "tiers":
		if c.full {
			return mx, errors.New("--grid and --full are two presets: give one")
		}
		set := map[string]bool{}
		if c.fs != nil {
			c.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		}
		if !set["workloads"] {
			wl = TiersGridWorkloads
		}
		if !set["loads"] {
			loads = TiersGridLoads
		}
		if !set["seeds"] {
			seeds = TiersGridSeeds
		}
		if !set["policies"] {
			policies = TiersGridPolicies
		}
	default:
		return mx, fmt.Errorf("--grid %q: the presets are tiers", c.grid)
	}
	if c.tracePath != "" {
		var clash []string
		if c.fs != nil {
			c.fs.Visit(func(f *flag.Flag) {
				switch f.Name {
				case "workloads", "seeds", "seed-base", "shrink", "full", "write-trace":
					clash = append(clash, "--"+f.Name)
				}
			})
		}
		if len(clash) > 0 {
			return mx, fmt.Errorf("--trace replays its files, one a seed: it takes no %s", strings.Join(clash, ", "))
		}
		var trs []*Trace
		for _, path := range splitList(c.tracePath) {
			tr, err := readTraceFile(path)
			if err != nil {
				return mx, err
			}
			trs = append(trs, tr)
		}
		if len(trs) == 0 {
			return mx, errors.New("--trace names no file")
		}
		mx.Workloads = []Workload{FromTraces(trs...)}
		seeds, c.seedBase = len(trs), 1
	} else {
		for _, s := range splitList(wl) {
			w, err := ParseWorkload(s)
			if err != nil {
				return mx, err
			}
			mx.Workloads = append(mx.Workloads, w.Shrink(c.shrink))
		}
	}
	tiered := false
	for _, s := range splitList(policies) {
		v, err := ParseVariant(s)
		if err != nil {
			return mx, err
		}
		mx.Policies = append(mx.Policies, v.Policy)
		mx.Variants = append(mx.Variants, v)
		tiered = tiered || v.Serving != (Serving{})
	}
	if !tiered {
		mx.Variants = nil
	}
	mx.Tiers = c.tiers
	sat, err := ParseVariant(c.saturation)
	if err != nil {
		return mx, fmt.Errorf("--saturation: %w", err)
	}
	if sat.Policy.Kind != sched.KindFCFS {
		return mx, fmt.Errorf("--saturation %s: the load is defined by FCFS", c.saturation)
	}
	mx.Saturation = sat
	for _, s := range splitList(loads) {
		l, err := strconv.ParseFloat(s, 64)
		if err != nil || !(l > 0) {
			return mx, fmt.Errorf("bad load %q", s)
		}
		mx.Loads = append(mx.Loads, l)
	}
	if seeds < 1 {
		return mx, errors.New("need at least one seed")
	}
	for i := 0; i < seeds; i++ {
		mx.Seeds = append(mx.Seeds, c.seedBase+uint64(i))
	}
	mx.Base = c.opts
	mx.Base.Index = Index(c.index)
	mx.Base.CapacityTokens = c.capacity
	mx.Workers = c.workers
	return mx, nil
}

func readTraceFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadJSONL(f, filepath.Base(path))
}

func writeTraceFile(path string, tr *Trace) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := tr.WriteJSONL(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// Run runs the command: tables (or JSON with --json) on stdout, plots into
// --plots. progress, if not nil, is called after every simulation.
func (c *CLI) Run(stdout, stderr io.Writer, progress func(done, total int)) error {
	if c.fromJSON != "" {
		var rs []io.Reader
		for _, p := range splitList(c.fromJSON) {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			rs = append(rs, f)
		}
		rep, err := ReadReports(rs...)
		if err != nil {
			return err
		}
		return c.output(stdout, stderr, rep)
	}
	mx, err := c.Matrix()
	if err != nil {
		return err
	}
	if c.writeTrace != "" {
		seeds := mx.Seeds
		if !strings.Contains(c.writeTrace, "{seed}") {
			seeds = seeds[:1]
		}
		for _, s := range seeds {
			path := strings.ReplaceAll(c.writeTrace, "{seed}", strconv.FormatUint(s, 10))
			if err := writeTraceFile(path, mx.Workloads[0].Trace(s)); err != nil {
				return err
			}
			fmt.Fprintln(stderr, "wrote", path)
		}
		return nil
	}
	// The simulator allocates briskly; trading memory for GC time pays.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	mx.Progress = progress
	rep, err := mx.Run()
	if err != nil {
		return err
	}
	return c.output(stdout, stderr, rep)
}

// output writes the plots (--plots) and prints the report.
func (c *CLI) output(stdout, stderr io.Writer, rep *Report) error {
	if c.plots != "" {
		paths, err := WritePlots(rep, c.plots, c.cdfLoad, c.plotFormat)
		if err != nil {
			return err
		}
		for _, p := range paths {
			fmt.Fprintln(stderr, "wrote", p)
		}
	}
	return c.print(stdout, rep)
}

func (c *CLI) print(stdout io.Writer, rep *Report) error {
	switch {
	case c.jsonOut:
		return rep.WriteJSON(stdout)
	case c.markdown:
		return rep.WriteMarkdown(stdout)
	}
	return rep.WriteTable(stdout)
}
