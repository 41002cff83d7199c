package sim

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kvcm/kvcm/core/sched"
)

// Matrix is an experiment: every workload × policy × load × seed, with the
// load ρ relative to each workload's FCFS saturation throughput.
//
// Saturation: per workload and seed, the trace's backlog (every request at
// time 0, no think time; Trace.Backlog) is served by FCFS, and the
// saturation throughput μ is requests finished over the makespan; a
// workload's μ is the mean over its seeds.
//
// Load, one definition for generated and replayed traces: a trace's arrival
// rate is its measured one, ArrivalRate (open-loop requests less one over
// the span of their arrivals). At load ρ each trace's arrival times are
// scaled so that this rate is exactly ρ·μ (with sessions: ρ·μ divided by
// the trace's requests per session, think times unchanged). A trace written
// with WriteJSONL and replayed therefore runs exactly as generated.
//
// A Replay workload replays its Traces, one a seed, so it needs as many
// traces as the matrix has seeds.
type Matrix struct {
	Workloads []Workload
	// Policies run on the GPU tier alone; Variants, when set, replace them
	// with policies served each its own way.
	Policies []sched.Policy
	Variants []Variant
	// Tiers sizes the cold levels of tiered variants.
	Tiers Tiers
	// Saturation is the variant whose backlog throughput defines the load
	// (its policy must be FCFS); zero: FCFS on the GPU tier alone.
	Saturation Variant
	Loads      []float64
	Seeds      []uint64
	// Base is the run configuration; Policy and CapacityTokens are set per
	// run (CapacityTokens only when Base leaves it 0).
	Base Options
	// Workers runs that many simulations at once (0: GOMAXPROCS). Each
	// phase (saturation, then the matrix) starts its longest simulations
	// first, so that with many workers none is left running alone at the
	// end.
	Workers int
	// Progress, if set, is called after every finished run.
	Progress func(done, total int)
}

// CDFPoints is the number of quantiles a Point keeps of its pooled TTFTs.
const CDFPoints = 201

// Report is a finished experiment.
type Report struct {
	Cost        CostModel `json:"cost"`
	TokenBudget int       `json:"token_budget"`
	MaxBatch    int       `json:"max_batch"`
	Block       int       `json:"tokens_per_block"`
	Warmup      float64   `json:"warmup"`
	Index       Index     `json:"index"`
	Seeds       []uint64  `json:"seeds"`
	// SaturationOf is the variant whose saturation defines the load.
	SaturationOf string          `json:"saturation_of"`
	Workloads    []WorkloadPoint `json:"workloads"`
	WallSeconds  float64         `json:"wall_seconds"`
}

// WorkloadPoint is one workload's results.
type WorkloadPoint struct {
	Name           string `json:"name"`
	Requests       int    `json:"requests"`
	CapacityTokens int64  `json:"capacity_tokens"`
	// Footprint is the workload's specified footprint (Workload.Footprint)
	// or, for replayed traces, the mean over its traces of
	// SharedPrefixTokens.
	Footprint int64 `json:"distinct_prefix_tokens"`
	// FootprintMeasured says Footprint was measured from the traces.
	FootprintMeasured bool    `json:"footprint_measured,omitempty"`
	Saturation        float64 `json:"fcfs_saturation_rps"`
	// SaturationBySeed is each seed's μ.
	SaturationBySeed []float64 `json:"fcfs_saturation_rps_by_seed"`
	Points           []Point   `json:"points"`
}

// Point is one policy at one load, over seeds.
type Point struct {
	Policy string  `json:"policy"`
	Bound  string  `json:"starvation_bound"`
	Load   float64 `json:"load"`
	// Runs are the per-seed metrics, in Seeds order.
	Runs []Metrics `json:"runs"`
	// Mean and CI over seeds of each metric.
	Agg Aggregate `json:"agg"`
	// GainVsFCFS: per seed, 1 - policy/FCFS (paired on the same trace), for
	// mean and p99 TTFT; positive is better. Nil for FCFS itself or when
	// the matrix has no FCFS.
	GainMean *Estimate `json:"ttft_mean_gain_vs_fcfs,omitempty"`
	GainP99  *Estimate `json:"ttft_p99_gain_vs_fcfs,omitempty"`
	// Gains are the same against every FCFS variant of the matrix but the
	// point itself (the first of them is GainMean and GainP99).
	Gains []Gain `json:"gains,omitempty"`
	// TTFTQuantiles are the quantiles 0, 1/(CDFPoints-1), …, 1 of the
	// measured TTFTs of every seed pooled: the TTFT CDF.
	TTFTQuantiles []float64 `json:"ttft_quantiles,omitempty"`
	// RunSeconds is the wall-clock time of each seed's simulation, in
	// Seeds order (what sizing a grid needs; it varies with the machine).
	RunSeconds []float64 `json:"run_seconds,omitempty"`
}

// Aggregate holds the over-seed estimates of the metrics.
type Aggregate struct {
	TTFTMean, TTFTP50, TTFTP90, TTFTP99      Estimate
	QueueMean, QueueP50, QueueP90, QueueP99  Estimate
	TransferMean, TransferP99                Estimate
	PrefillMean, PrefillP99                  Estimate
	HitRatio, PrefillTokens, Evictions       Estimate
	HitGPU, HitHost, HitDisk                 Estimate
	OnboardGB, OffloadGB, DiskGB, PrefetchGB Estimate
	RecomputedGB                             Estimate
	MaxWait, MaxBypass, BoundViolations      Estimate
	SchedMicros, Throughput                  Estimate
	// WorstWait and WorstBypass are the largest over seeds.
	WorstWait, WorstBypass float64
}

func aggregate(runs []Metrics) Aggregate {
	f := func(get func(m Metrics) float64) Estimate {
		xs := make([]float64, len(runs))
		for i, m := range runs {
			xs[i] = get(m)
		}
		return Estimate95(xs)
	}
	var worstWait, worstBypass float64
	for _, m := range runs {
		worstWait, worstBypass = max(worstWait, m.MaxWait), max(worstBypass, m.MaxBypass)
	}
	return Aggregate{
		WorstWait: worstWait, WorstBypass: worstBypass,
		TTFTMean:        f(func(m Metrics) float64 { return m.TTFT.Mean }),
		TTFTP50:         f(func(m Metrics) float64 { return m.TTFT.P50 }),
		TTFTP90:         f(func(m Metrics) float64 { return m.TTFT.P90 }),
		TTFTP99:         f(func(m Metrics) float64 { return m.TTFT.P99 }),
		QueueMean:       f(func(m Metrics) float64 { return m.Queue.Mean }),
		QueueP50:        f(func(m Metrics) float64 { return m.Queue.P50 }),
		QueueP90:        f(func(m Metrics) float64 { return m.Queue.P90 }),
		QueueP99:        f(func(m Metrics) float64 { return m.Queue.P99 }),
		TransferMean:    f(func(m Metrics) float64 { return m.Transfer.Mean }),
		TransferP99:     f(func(m Metrics) float64 { return m.Transfer.P99 }),
		HitGPU:          f(func(m Metrics) float64 { return m.HitByLevel[0] }),
		HitHost:         f(func(m Metrics) float64 { return m.HitByLevel[1] }),
		HitDisk:         f(func(m Metrics) float64 { return m.HitByLevel[2] }),
		OnboardGB:       f(func(m Metrics) float64 { return m.OnboardGB }),
		OffloadGB:       f(func(m Metrics) float64 { return m.OffloadGB }),
		DiskGB:          f(func(m Metrics) float64 { return m.DiskGB }),
		PrefetchGB:      f(func(m Metrics) float64 { return m.PrefetchGB }),
		RecomputedGB:    f(func(m Metrics) float64 { return m.RecomputedGB }),
		PrefillMean:     f(func(m Metrics) float64 { return m.Prefill.Mean }),
		PrefillP99:      f(func(m Metrics) float64 { return m.Prefill.P99 }),
		HitRatio:        f(func(m Metrics) float64 { return m.HitRatio }),
		PrefillTokens:   f(func(m Metrics) float64 { return m.PrefillTokens }),
		Evictions:       f(func(m Metrics) float64 { return m.Evictions }),
		MaxWait:         f(func(m Metrics) float64 { return m.MaxWait }),
		MaxBypass:       f(func(m Metrics) float64 { return m.MaxBypass }),
		BoundViolations: f(func(m Metrics) float64 { return m.BoundViolations }),
		SchedMicros:     f(func(m Metrics) float64 { return m.SchedMicros }),
		Throughput:      f(func(m Metrics) float64 { return m.Throughput }),
	}
}

// Gain is a point's paired gain against one baseline variant.
type Gain struct {
	Against string   `json:"against"`
	Mean    Estimate `json:"ttft_mean"`
	P99     Estimate `json:"ttft_p99"`
}

// variants returns the matrix's variants: Variants, or Policies on the GPU.
func (mx Matrix) variants() []Variant {
	if len(mx.Variants) > 0 {
		return mx.Variants
	}
	vs := make([]Variant, len(mx.Policies))
	for i, p := range mx.Policies {
		vs[i] = Variant{Policy: p}
	}
	return vs
}

type job2 struct {
	wi, pi, li, si int
	backlog        bool
	// cost orders the jobs, longest first, so that a long simulation does
	// not start last and leave the other workers idle.
	cost float64
}

// traceCost estimates the work of simulating tr: the tokens it prefills and
// decodes (served over the tiers, about twice as much).
func traceCost(tr *Trace, v Variant) float64 {
	var n float64
	for i := range tr.Requests {
		n += float64(tr.Requests[i].PromptLen() + tr.Requests[i].Output)
	}
	if v.Serving.Tiered {
		n *= 2
	}
	return n
}

// longestFirst sorts jobs by decreasing cost, stably.
func longestFirst(jobs []job2) {
	slices.SortStableFunc(jobs, func(a, b job2) int {
		switch {
		case a.cost > b.cost:
			return -1
		case a.cost < b.cost:
			return 1
		}
		return 0
	})
}

// Run runs the experiment.
func (mx Matrix) Run() (*Report, error) {
	start := time.Now()
	vs := mx.variants()
	if len(mx.Workloads) == 0 || len(vs) == 0 || len(mx.Loads) == 0 || len(mx.Seeds) == 0 {
		return nil, fmt.Errorf("sim: an experiment needs workloads, policies, loads and seeds")
	}
	for _, l := range mx.Loads {
		if !(l > 0) {
			return nil, fmt.Errorf("sim: load %v must be positive", l)
		}
	}
	workers := mx.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	nw, np, nl, ns := len(mx.Workloads), len(vs), len(mx.Loads), len(mx.Seeds)
	total := nw*ns + nw*np*nl*ns
	var mu sync.Mutex
	done := 0
	tick := func() {
		mu.Lock()
		defer mu.Unlock()
		done++
		if mx.Progress != nil {
			mx.Progress(done, total)
		}
	}
	traces := make([][]*Trace, nw)
	for wi, w := range mx.Workloads {
		if w.Kind == Replay && len(w.Traces) != ns {
			return nil, fmt.Errorf("sim: workload %s replays %d traces, one a seed, but the experiment has %d seeds",
				w.Name(), len(w.Traces), ns)
		}
		traces[wi] = make([]*Trace, ns)
		for si, s := range mx.Seeds {
			if w.Kind == Replay {
				traces[wi][si] = w.Traces[si]
			} else {
				traces[wi][si] = w.Trace(s)
			}
		}
	}
	opts := func(w Workload, v Variant) Options {
		o := v.apply(mx.Base, mx.Tiers)
		if o.CapacityTokens == 0 {
			o.CapacityTokens = w.Capacity()
		}
		return o
	}

	// Phase 1: saturation, per workload and seed, of FCFS on the GPU tier
	// or as Saturation serves.
	gpuFCFS := Variant{Policy: sched.FCFS()}
	satV := gpuFCFS
	if mx.Saturation != (Variant{}) {
		if mx.Saturation.Policy.Kind != sched.KindFCFS {
			return nil, fmt.Errorf("sim: saturation variant %v must be FCFS", mx.Saturation)
		}
		satV = mx.Saturation
	}
	sat := make([][]float64, nw)
	for wi := range sat {
		sat[wi] = make([]float64, ns)
	}
	var jobs []job2
	for wi := range mx.Workloads {
		for si := range mx.Seeds {
			jobs = append(jobs, job2{wi: wi, si: si, backlog: true, cost: traceCost(traces[wi][si], satV)})
		}
	}
	longestFirst(jobs)
	err := parallel(workers, jobs, func(j job2) error {
		w := mx.Workloads[j.wi]
		res, err := Run(traces[j.wi][j.si].Backlog(), opts(w, satV))
		if err != nil {
			return fmt.Errorf("%s seed %d saturation: %w", w.Name(), mx.Seeds[j.si], err)
		}
		sat[j.wi][j.si] = float64(len(res.Requests)) / res.SimTime
		tick()
		return nil
	})
	if err != nil {
		return nil, err
	}

	// Phase 2: the matrix.
	runs := make([][][][]Metrics, nw)
	ttfts := make([][][][][]float64, nw)
	secs := make([][][][]float64, nw)
	for wi := range runs {
		runs[wi] = make([][][]Metrics, np)
		ttfts[wi] = make([][][][]float64, np)
		secs[wi] = make([][][]float64, np)
		for pi := range runs[wi] {
			runs[wi][pi] = make([][]Metrics, nl)
			ttfts[wi][pi] = make([][][]float64, nl)
			secs[wi][pi] = make([][]float64, nl)
			for li := range runs[wi][pi] {
				runs[wi][pi][li] = make([]Metrics, ns)
				ttfts[wi][pi][li] = make([][]float64, ns)
				secs[wi][pi][li] = make([]float64, ns)
			}
		}
	}
	jobs = jobs[:0]
	for wi := range mx.Workloads {
		for li := range mx.Loads {
			for si := range mx.Seeds {
				for pi := range vs {
					jobs = append(jobs, job2{wi: wi, pi: pi, li: li, si: si, cost: traceCost(traces[wi][si], vs[pi])})
				}
			}
		}
	}
	longestFirst(jobs)
	mus := make([]float64, nw)
	for wi := range mus {
		mus[wi] = mean(sat[wi])
	}
	err = parallel(workers, jobs, func(j job2) error {
		w, p := mx.Workloads[j.wi], vs[j.pi]
		tr := traces[j.wi][j.si]
		t0 := time.Now()
		res, err := Run(tr.TimeScaled(LoadScale(tr, mx.Loads[j.li], mus[j.wi])), opts(w, p))
		secs[j.wi][j.pi][j.li][j.si] = time.Since(t0).Seconds()
		if err != nil {
			return fmt.Errorf("%s %v load %v seed %d: %w", w.Name(), p, mx.Loads[j.li], mx.Seeds[j.si], err)
		}
		runs[j.wi][j.pi][j.li][j.si] = res.Metrics()
		ttfts[j.wi][j.pi][j.li][j.si] = res.TTFTs()
		tick()
		return nil
	})
	if err != nil {
		return nil, err
	}

	rep := &Report{
		Cost: mx.Base.Cost, TokenBudget: mx.Base.TokenBudget, MaxBatch: mx.Base.MaxBatch,
		Block: mx.Base.TokensPerBlock, Warmup: mx.Base.Warmup, Index: mx.Base.Index, Seeds: mx.Seeds,
		SaturationOf: satV.String(),
	}
	fcfs := slices.IndexFunc(vs, func(v Variant) bool { return v.Policy.Kind == sched.KindFCFS })
	for wi, w := range mx.Workloads {
		wp := WorkloadPoint{
			Name: w.Name(), Requests: len(traces[wi][0].Requests), CapacityTokens: opts(w, gpuFCFS).CapacityTokens,
			Footprint: w.Footprint(), Saturation: mus[wi], SaturationBySeed: sat[wi],
		}
		if w.Kind == Replay {
			var sum int64
			for _, tr := range traces[wi] {
				sum += SharedPrefixTokens(tr, mx.Base.TokensPerBlock)
			}
			wp.Footprint, wp.FootprintMeasured = sum/int64(ns), true
		}
		for li, load := range mx.Loads {
			for pi, p := range vs {
				pt := Point{Policy: p.String(), Bound: p.Policy.BoundString(), Load: load, Runs: runs[wi][pi][li],
					RunSeconds: secs[wi][pi][li]}
				pt.Agg = aggregate(pt.Runs)
				for bi, b := range vs {
					if b.Policy.Kind != sched.KindFCFS || bi == pi {
						continue
					}
					base := runs[wi][bi][li]
					gm := make([]float64, ns)
					gp := make([]float64, ns)
					for si := range gm {
						gm[si] = gain(base[si].TTFT.Mean, pt.Runs[si].TTFT.Mean)
						gp[si] = gain(base[si].TTFT.P99, pt.Runs[si].TTFT.P99)
					}
					g := Gain{Against: b.String(), Mean: Estimate95(gm), P99: Estimate95(gp)}
					pt.Gains = append(pt.Gains, g)
					if bi == fcfs {
						pt.GainMean, pt.GainP99 = &g.Mean, &g.P99
					}
				}
				var pooled []float64
				for _, x := range ttfts[wi][pi][li] {
					pooled = append(pooled, x...)
				}
				pt.TTFTQuantiles = quantiles(pooled, CDFPoints)
				wp.Points = append(wp.Points, pt)
			}
		}
		rep.Workloads = append(rep.Workloads, wp)
	}
	rep.WallSeconds = time.Since(start).Seconds()
	return rep, nil
}

// gain is the relative improvement of x over base: 1 - x/base.
func gain(base, x float64) float64 {
	if base == 0 {
		return 0
	}
	return 1 - x/base
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// LoadScale returns the factor that scales tr's arrival times
// (Trace.TimeScaled) to load rho of saturation throughput mu: afterwards
// ArrivalRate is rho·mu divided by the trace's requests per open-loop
// request (1 without sessions), so requests, follow-up turns included,
// arrive at about rho·mu.
func LoadScale(tr *Trace, rho, mu float64) float64 {
	open := 0
	for _, r := range tr.Requests {
		if r.Turn == 0 {
			open++
		}
	}
	target := rho * mu * float64(max(open, 1)) / float64(len(tr.Requests))
	return ArrivalRate(tr) / target
}

// parallel runs fn over jobs on n workers and returns the first error.
func parallel[T any](n int, jobs []T, fn func(T) error) error {
	ch := make(chan T)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range ch {
				mu.Lock()
				failed := first != nil
				mu.Unlock()
				if failed {
					continue
				}
				if err := fn(j); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, j := range jobs {
		ch <- j
	}
	close(ch)
	wg.Wait()
	return first
}

// ArrivalRate is the measured arrival rate of a trace's open-loop requests
// (first turns): their count less one over the span of their arrivals; 1
// when undefined (fewer than two, or all at once).
func ArrivalRate(tr *Trace) float64 {
	lo, hi, n := math.Inf(1), math.Inf(-1), 0
	for _, r := range tr.Requests {
		if r.Session != "" && r.Turn > 0 {
			continue
		}
		lo, hi, n = min(lo, r.Arrival), max(hi, r.Arrival), n+1
	}
	if n < 2 || !(hi > lo) {
		return 1
	}
	return float64(n-1) / (hi - lo)
}
