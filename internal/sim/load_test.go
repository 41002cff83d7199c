package sim

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/sched"
)

func replayed(t *testing.T, trs ...*Trace) []*Trace {
	t.Helper()
	var out []*Trace
	for _, tr := range trs {
		var buf bytes.Buffer
		require.NoError(t, tr.WriteJSONL(&buf))
		back, err := ReadJSONL(&buf, tr.Name)
		require.NoError(t, err)
		out = append(out, back)
	}
	return out
}

func runsWithoutWallClock(pts []Point) [][]Metrics {
	var out [][]Metrics
	for _, pt := range pts {
		runs := make([]Metrics, len(pt.Runs))
		for i, m := range pt.Runs {
			m.SchedMicros = 0
			runs[i] = m
		}
		out = append(out, runs)
	}
	return out
}

// A trace's load is its measured arrival rate over the saturation
// throughput: after LoadScale, ArrivalRate is exactly ρ·μ (per request of a
// session, for sessions), whatever rate the trace was generated at.
func TestLoadScaleGivesTheMeasuredArrivalRate(t *testing.T) {
	fast := &Trace{Name: "fast"}
	for i := 0; i < 50; i++ {
		fast.Requests = append(fast.Requests, Request{ID: fmt.Sprint(i), Arrival: 3 + 0.01*float64(i*i%7+i),
			Output: 1, Segments: []Segment{{Name: "x", Len: 4}}})
	}
	for _, tr := range []*Trace{tinyW2().Trace(1), NewW5().Shrink(8).Trace(2), fast} {
		for _, rho := range []float64{0.3, 0.85} {
			got := ArrivalRate(tr.TimeScaled(LoadScale(tr, rho, 4.2)))
			assert.InDelta(t, rho*4.2, got, 1e-9*got, "%s at %v", tr.Name, rho)
		}
	}
	w4 := NewW4().Shrink(20).Trace(1)
	perSession := float64(len(w4.Requests)) / float64(countOpen(w4))
	got := ArrivalRate(w4.TimeScaled(LoadScale(w4, 0.5, 3)))
	assert.InDelta(t, 0.5*3/perSession, got, 1e-9, "session starts at ρ·μ over requests per session")
}

func countOpen(tr *Trace) int {
	n := 0
	for _, r := range tr.Requests {
		if r.Turn == 0 {
			n++
		}
	}
	return n
}

// A replayed trace runs at the load it was generated for: writing a
// generated workload's traces and replaying them, one a seed, gives the
// same runs, saturation and gains as the generated experiment.
func TestAReplayedTraceRunsAtTheLoadItWasGeneratedFor(t *testing.T) {
	w := tinyW2()
	seeds := []uint64{1, 2, 3}
	mx := Matrix{
		Workloads: []Workload{w}, Policies: []sched.Policy{sched.FCFS(), sched.Window(8)},
		Loads: []float64{0.85}, Seeds: seeds, Base: tinyOpts(w, sched.FCFS()), Workers: 2,
	}
	gen, err := mx.Run()
	require.NoError(t, err)

	var trs []*Trace
	for _, s := range seeds {
		trs = append(trs, w.Trace(s))
	}
	mx.Workloads = []Workload{FromTraces(replayed(t, trs...)...)}
	rep, err := mx.Run()
	require.NoError(t, err)
	g, r := gen.Workloads[0], rep.Workloads[0]
	assert.Equal(t, g.SaturationBySeed, r.SaturationBySeed)
	assert.Equal(t, runsWithoutWallClock(g.Points), runsWithoutWallClock(r.Points))
	assert.Equal(t, g.Points[1].GainMean, r.Points[1].GainMean)
}

// A replayed trace's load is relative to its own saturation whatever its
// native arrival rate: a trace arriving at 100/s replayed at ρ = 0.1 runs
// far below saturation.
func TestAReplayedTraceLoadIsRelativeToItsSaturation(t *testing.T) {
	tr := &Trace{Name: "fast"}
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("r%03d", i)
		tr.Requests = append(tr.Requests, Request{
			ID: id, Arrival: float64(i) * 0.01, Output: 8,
			Segments: []Segment{{Name: id, Len: 256}},
		})
	}
	w := FromTraces(tr)
	w.CapacityTokens = 1 << 16
	base := DefaultOptions()
	base.TokenBudget, base.MaxBatch = 1024, 16
	rep, err := Matrix{
		Workloads: []Workload{w}, Policies: []sched.Policy{sched.FCFS()},
		Loads: []float64{0.1}, Seeds: []uint64{1}, Base: base, Workers: 1,
	}.Run()
	require.NoError(t, err)
	wp := rep.Workloads[0]
	assert.Less(t, wp.Points[0].Agg.Throughput.Mean, 0.3*wp.Saturation, "at ρ=0.1 the server must not run at saturation")
}

// Several replayed traces are seeds: the estimates are over them, and a
// replay needs exactly one trace a seed.
func TestSeveralTracesGiveIntervalsOverThem(t *testing.T) {
	w := tinyW2()
	trs := []*Trace{w.Trace(1), w.Trace(2), w.Trace(3)}
	rw := FromTraces(trs...)
	rw.CapacityTokens = tinyOpts(w, sched.FCFS()).CapacityTokens
	mx := Matrix{
		Workloads: []Workload{rw}, Policies: []sched.Policy{sched.FCFS(), sched.Window(8)},
		Loads: []float64{0.9}, Seeds: []uint64{1, 2, 3}, Base: tinyOpts(w, sched.FCFS()), Workers: 2,
	}
	mx.Base.CapacityTokens = 0
	rep, err := mx.Run()
	require.NoError(t, err)
	wp := rep.Workloads[0]
	assert.Len(t, wp.SaturationBySeed, 3)
	assert.Equal(t, 3, wp.Points[0].Agg.TTFTMean.N)
	assert.Positive(t, wp.Points[0].Agg.TTFTMean.CI, "the traces differ, so the interval has a width")
	assert.Equal(t, 3, wp.Points[1].GainMean.N)
	assert.Equal(t, (SharedPrefixTokens(trs[0], 16)+SharedPrefixTokens(trs[1], 16)+SharedPrefixTokens(trs[2], 16))/3,
		wp.Footprint, "a replayed trace's footprint is measured: the mean over its traces")
	assert.Positive(t, wp.Footprint)
	assert.True(t, wp.FootprintMeasured)
	var buf bytes.Buffer
	require.NoError(t, rep.WriteTable(&buf))
	assert.Contains(t, buf.String(), fmt.Sprintf("the %d-token footprint measured from the traces", wp.Footprint))

	mx.Seeds = []uint64{1, 2}
	_, err = mx.Run()
	assert.ErrorContains(t, err, "replays 3 traces, one a seed, but the experiment has 2 seeds")
}

// A trace's shared-prefix footprint counts every block that begins two
// prompts once: W1's 64 system prompts, nothing for W5.
func TestSharedPrefixTokensCountsSharedBlocksOnce(t *testing.T) {
	assert.Equal(t, int64(64*2048), SharedPrefixTokens(NewW1().Trace(1), 16))
	assert.Zero(t, SharedPrefixTokens(NewW5().Shrink(16).Trace(1), 16))
	sys := Segment{Name: "s", Len: 40}
	tr := &Trace{Requests: []Request{
		{ID: "a", Segments: []Segment{sys, {Name: "a", Len: 30}}, Output: 1},
		{ID: "b", Segments: []Segment{sys, {Name: "b", Len: 30}}, Output: 1},
		{ID: "c", Segments: []Segment{sys, {Name: "c", Len: 30}}, Output: 1},
	}}
	assert.Equal(t, int64(32), SharedPrefixTokens(tr, 16), "the two full blocks of the 40 shared tokens")
}

// `--trace` takes several files, one a seed; it refuses the flags that
// choose generated workloads or seeds instead of ignoring them.
func TestCLIReplaysSeveralTracesAsSeeds(t *testing.T) {
	dir := t.TempDir()
	newCLI := func(args ...string) (*CLI, error) {
		c := &CLI{}
		fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
		c.Register(fs)
		return c, fs.Parse(args)
	}
	c, err := newCLI("--workloads", "w5", "--shrink", "100", "--seeds", "2", "--seed-base", "7",
		"--write-trace", filepath.Join(dir, "w5-{seed}.jsonl"))
	require.NoError(t, err)
	require.NoError(t, c.Run(&bytes.Buffer{}, &bytes.Buffer{}, nil))
	files := filepath.Join(dir, "w5-7.jsonl") + "," + filepath.Join(dir, "w5-8.jsonl")
	for _, f := range []string{"w5-7.jsonl", "w5-8.jsonl"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, "{seed} writes every seed's trace")
	}

	c, err = newCLI("--trace", files, "--loads", "0.5")
	require.NoError(t, err)
	mx, err := c.Matrix()
	require.NoError(t, err)
	require.Len(t, mx.Workloads, 1)
	assert.Len(t, mx.Workloads[0].Traces, 2)
	assert.Equal(t, []uint64{1, 2}, mx.Seeds, "one seed a file")
	assert.Equal(t, "trace:w5-7.jsonl,w5-8.jsonl", mx.Workloads[0].Name())

	for _, extra := range [][]string{{"--seeds", "5"}, {"--seed-base", "3"}, {"--workloads", "w2"}, {"--full"}, {"--shrink", "2"}} {
		c, err := newCLI(append([]string{"--trace", files}, extra...)...)
		require.NoError(t, err)
		_, err = c.Matrix()
		assert.ErrorContains(t, err, "it takes no "+extra[0], "%v", extra)
	}
}
