package sim

import (
	"math"
	"slices"
)

// Metrics summarize one run over its measured requests (after warm-up),
// except MaxWait and MaxBypass, which cover every request: starvation is a
// worst case. Times are in seconds.
type Metrics struct {
	Requests int `json:"requests"`
	// TTFT = Queue + Transfer + Prefill, per request.
	TTFT     Dist `json:"ttft"`
	Queue    Dist `json:"queue"`
	Transfer Dist `json:"transfer"`
	Prefill  Dist `json:"prefill"`
	// HitRatio is reused prompt tokens over prompt tokens; HitByLevel
	// splits it by the level the reused blocks were on at admission (GPU,
	// host, disk).
	HitRatio   float64    `json:"hit_ratio"`
	HitByLevel [3]float64 `json:"hit_by_level"`
	// OnboardGB, OffloadGB and DiskGB are the modelled gigabytes (1e9 B)
	// moved during the whole run: to the GPU from colder levels, from the
	// GPU to colder levels, and read from or written to disk.
	OnboardGB float64 `json:"onboard_gb"`
	OffloadGB float64 `json:"offload_gb"`
	DiskGB    float64 `json:"disk_gb"`
	// PrefetchGB is the part of OnboardGB that prefetch brought.
	PrefetchGB float64 `json:"prefetch_gb"`
	// RecomputedGB is the cached KV that admission chose to recompute
	// rather than read back (Options.Recompute), whole run.
	RecomputedGB float64 `json:"recomputed_gb"`
	// PrefillTokens is the mean number of prompt tokens computed (not
	// reused) per request.
	PrefillTokens float64 `json:"prefill_tokens"`
	Evictions     float64 `json:"evictions"`
	MaxWait       float64 `json:"max_wait"`
	MaxBypass     float64 `json:"max_bypass"`
	// BoundViolations counts requests bypassed more than the policy's
	// bound (0 for a correct bounded policy; unbounded ones report 0).
	BoundViolations float64 `json:"bound_violations"`
	// SchedMicros is the scheduler's wall-clock time per engine step, in
	// microseconds.
	SchedMicros float64 `json:"sched_us_per_step"`
	// Throughput is finished requests per simulated second, whole run.
	Throughput float64 `json:"throughput"`
}

// Dist is a distribution summary.
type Dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Dist{Mean: sum / float64(len(s)), P50: quantile(s, 0.5), P90: quantile(s, 0.9), P99: quantile(s, 0.99)}
}

// quantile of sorted xs, linear interpolation between closest ranks.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	f := pos - float64(lo)
	return sorted[lo]*(1-f) + sorted[hi]*f
}

// quantiles returns n quantiles of xs, at 0, 1/(n-1), …, 1 (nil for no xs).
func quantiles(xs []float64, n int) []float64 {
	if len(xs) == 0 || n < 2 {
		return nil
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	out := make([]float64, n)
	for i := range out {
		out[i] = quantile(s, float64(i)/float64(n-1))
	}
	return out
}

// Metrics computes the run's metrics.
func (r *Result) Metrics() Metrics {
	ms := r.Measured()
	var m Metrics
	m.Requests = len(ms)
	ttft := make([]float64, len(ms))
	queue := make([]float64, len(ms))
	xfer := make([]float64, len(ms))
	pre := make([]float64, len(ms))
	var prompt, reused int64
	var byLevel [3]int64
	for i, q := range ms {
		ttft[i], queue[i], xfer[i], pre[i] = q.TTFT(), q.Queueing(), q.Transfer(), q.Prefill()
		prompt += int64(q.Prompt)
		reused += int64(q.Reused)
		for l, n := range q.ReusedByLevel {
			byLevel[l] += int64(n)
		}
	}
	m.TTFT, m.Queue, m.Transfer, m.Prefill = dist(ttft), dist(queue), dist(xfer), dist(pre)
	if prompt > 0 {
		m.HitRatio = float64(reused) / float64(prompt)
		for l, n := range byLevel {
			m.HitByLevel[l] = float64(n) / float64(prompt)
		}
	}
	gb := r.BlockBytes / 1e9
	mv := r.Moved
	m.OnboardGB = float64(mv[1][0]+mv[2][0]) * gb
	m.OffloadGB = float64(mv[0][1]+mv[0][2]) * gb
	m.DiskGB = float64(mv[0][2]+mv[1][2]+mv[2][0]+mv[2][1]) * gb
	m.PrefetchGB = float64(r.Prefetched) * gb
	m.RecomputedGB = float64(r.Recomputed) * gb
	if len(ms) > 0 {
		m.PrefillTokens = float64(prompt-reused) / float64(len(ms))
	}
	for _, q := range r.Requests {
		m.MaxWait = max(m.MaxWait, q.Queueing())
		m.MaxBypass = max(m.MaxBypass, float64(q.Bypassed))
	}
	m.Evictions = float64(r.Evictions)
	m.BoundViolations = float64(r.Sched.BoundViolations)
	if r.Steps > 0 {
		m.SchedMicros = float64(r.SchedTime.Nanoseconds()) / 1e3 / float64(r.Steps)
	}
	if r.SimTime > 0 {
		m.Throughput = float64(len(r.Requests)) / r.SimTime
	}
	return m
}

// TTFTs returns the measured requests' TTFTs.
func (r *Result) TTFTs() []float64 {
	ms := r.Measured()
	out := make([]float64, len(ms))
	for i, q := range ms {
		out[i] = q.TTFT()
	}
	return out
}

// Estimate is a mean over seeds with the half-width of its 95% confidence
// interval (Student t): the interval is [Mean-CI, Mean+CI].
type Estimate struct {
	Mean float64 `json:"mean"`
	CI   float64 `json:"ci95"`
	N    int     `json:"n"`
}

// Excludes0 reports whether the interval excludes zero.
func (e Estimate) Excludes0() bool { return e.N > 1 && (e.Mean-e.CI > 0 || e.Mean+e.CI < 0) }

// Estimate95 returns the mean of xs and its 95% CI half-width.
func Estimate95(xs []float64) Estimate {
	n := len(xs)
	if n == 0 {
		return Estimate{}
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(n)
	if n == 1 {
		return Estimate{Mean: mean, N: 1}
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	sd := math.Sqrt(ss / float64(n-1))
	return Estimate{Mean: mean, CI: tQuantile975(n-1) * sd / math.Sqrt(float64(n)), N: n}
}

// tQuantile975 is the 0.975 quantile of Student's t with df degrees of
// freedom.
func tQuantile975(df int) float64 {
	table := []float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df < len(table) {
		return table[df]
	}
	return 1.96 + 2.4/float64(df) // within 0.002 beyond 30
}
