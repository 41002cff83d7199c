package sim

import (
	"bytes"
	"flag"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/sched"
)

// tinyW2: 8 groups, 64 requests, 256-token system prompts, Zipf 1.2, KV
// capacity half the distinct prefixes: small, skewed and under pressure.
func tinyW2() Workload {
	w := NewW2(1.2, 0.5)
	w.Groups, w.PerGroup, w.SystemLen, w.QuestionLen, w.OutputLen = 8, 8, 256, 32, 16
	return w
}

func tinyOpts(w Workload, p sched.Policy) Options {
	o := DefaultOptions()
	o.Policy = p
	o.CapacityTokens = w.Capacity() + 4096 // room for the running batch too
	o.TokenBudget = 1024
	o.MaxBatch = 16
	return o
}

func allPolicies() []sched.Policy {
	return []sched.Policy{sched.FCFS(), sched.LPM(0), sched.KLPM(3, 0), sched.Window(8), sched.FullResort()}
}

func run(t *testing.T, tr *Trace, o Options) *Result {
	t.Helper()
	res, err := Run(tr, o)
	require.NoError(t, err)
	require.Len(t, res.Requests, len(tr.Requests), "every request finishes")
	return res
}

func TestEnablingTheNullIndexChangesNothing(t *testing.T) {
	w := tinyW2()
	tr := w.Trace(3).TimeScaled(0.05)
	base := tinyOpts(w, sched.FCFS())
	base.Index = IndexNone
	want := run(t, tr, base)
	for _, p := range allPolicies() {
		o := tinyOpts(w, p)
		o.Index = IndexNull
		got := run(t, tr, o)
		assert.Equal(t, want.Requests, got.Requests, "%v with the null index is FCFS without one", p)
		assert.Equal(t, want.Evictions, got.Evictions)
		assert.Equal(t, want.Steps, got.Steps)
	}
}

func TestRunsAreDeterministic(t *testing.T) {
	w := tinyW2()
	tr := w.Trace(1).TimeScaled(0.05)
	o := tinyOpts(w, sched.KLPM(2, 0))
	a, b := run(t, tr, o), run(t, tr, o)
	assert.Equal(t, a.Requests, b.Requests)
	assert.Equal(t, a.Evictions, b.Evictions)
}

func TestTTFTFollowsTheCostModel(t *testing.T) {
	c := DefaultCost()
	tr := &Trace{Name: "one", Requests: []Request{{ID: "a", Arrival: 1, Segments: []Segment{{"a", 1000}}, Output: 3}}}
	o := DefaultOptions()
	o.CapacityTokens = 1 << 16
	r := run(t, tr, o).Requests[0]
	want := c.T0 + c.Beta*1000 + c.Gamma*1000*500
	assert.InDelta(t, 0.0, r.Queueing(), 1e-12, "idle server admits at once")
	assert.InDelta(t, want, r.TTFT(), 1e-12)
	dec := func(ctx int) float64 { return c.D0 + c.D1 + c.D2*float64(ctx) }
	assert.InDelta(t, want+dec(1001)+dec(1002), r.Finish-r.Arrival, 1e-12, "two decode steps after the first token")

	// Chunked: a budget of 400 splits the prompt into 400, 400, 200.
	o.TokenBudget = 400
	r = run(t, tr, o).Requests[0]
	chunk := func(u, p float64) float64 { return c.T0 + c.Beta*u + c.Gamma*u*(p+u/2) }
	assert.InDelta(t, chunk(400, 0)+chunk(400, 400)+chunk(200, 800), r.TTFT(), 1e-12)
}

func TestFinishedRequestsLeaveTheirBlocksCached(t *testing.T) {
	sys := Segment{"sys", 512}
	tr := &Trace{Name: "two", Requests: []Request{
		{ID: "a", Arrival: 0, Segments: []Segment{sys, {"qa", 40}}, Output: 4},
		{ID: "b", Arrival: 100, Segments: []Segment{sys, {"qb", 40}}, Output: 4},
	}}
	o := DefaultOptions()
	o.CapacityTokens = 4096
	res := run(t, tr, o)
	assert.Zero(t, res.Requests[0].Reused)
	assert.Equal(t, 512, res.Requests[1].Reused, "b arrives long after a finished and reuses its system prompt")
	assert.Less(t, res.Requests[1].TTFT(), res.Requests[0].TTFT())
}

func TestFollowUpTurnsArriveAfterThinkTimeAndReuseTheConversation(t *testing.T) {
	w := NewW4()
	w.Sessions, w.MinTurns, w.MaxTurns, w.SystemLen = 1, 3, 3, 64
	tr := w.Trace(1)
	res := run(t, tr, tinyOpts(w, sched.FCFS()))
	require.Len(t, res.Requests, 3)
	for k := 1; k < 3; k++ {
		prev, cur := res.Requests[k-1], res.Requests[k]
		assert.InDelta(t, prev.Finish+tr.Requests[k].Think, cur.Arrival, 1e-9, "turn %d arrives think time after turn %d ends", k, k-1)
		// The previous prompt and answer are cached, but for the last,
		// never computed, answer token and the partial block.
		assert.GreaterOrEqual(t, cur.Reused, (prev.Prompt+w.OutputLen-1)/16*16, "turn %d", k)
	}
}

func TestAdmissionControlNeverRunsOutOfPages(t *testing.T) {
	w := tinyW2()
	w.CapacityFactor = 0.25
	for _, p := range allPolicies() {
		o := tinyOpts(w, p)
		o.CapacityTokens = 1200 // a handful of requests at a time
		res := run(t, w.Trace(2).Backlog(), o)
		assert.Positive(t, res.Evictions, "%v: the cache is under pressure", p)
	}
	o := tinyOpts(w, sched.FCFS())
	o.CapacityTokens = 100
	_, err := Run(w.Trace(2), o)
	assert.ErrorContains(t, err, "more than the capacity", "a request that can never fit is refused up front")
}

func TestManagerBackedLPMRaisesTheHitRatioUnderABacklog(t *testing.T) {
	// 32 groups of 512-token prompts, Zipf 0.8, a quarter of the prefixes
	// fit: reordering a backlog by cached prefix pays. (When every prefix
	// fits, it does not: see docs/scheduling.md.)
	w := NewW2(0.8, 0.25)
	w.Groups, w.PerGroup, w.SystemLen, w.QuestionLen, w.OutputLen = 32, 8, 512, 32, 16
	tr := w.Trace(5).Backlog()
	o := tinyOpts(w, sched.FCFS())
	o.CapacityTokens = w.Capacity() + 2048
	fcfs := run(t, tr, o).Metrics()
	o.Policy = sched.LPM(0)
	lpm := run(t, tr, o).Metrics()
	assert.Greater(t, lpm.HitRatio, fcfs.HitRatio+0.1, "the index's scores really reorder admissions")
	assert.Greater(t, lpm.Throughput, fcfs.Throughput*1.2)
}

func TestTraceJSONLRoundTrip(t *testing.T) {
	tr := NewW4().Shrink(50).Trace(4)
	tr.Requests[0].Tokens = []int32{5, 6, 7}
	var buf bytes.Buffer
	require.NoError(t, tr.WriteJSONL(&buf))
	back, err := ReadJSONL(&buf, tr.Name)
	require.NoError(t, err)
	assert.Equal(t, tr.Requests, back.Requests)
	assert.Equal(t, []int32{5, 6, 7}, back.Requests[0].PromptTokens(), "explicit tokens win over segments")

	_, err = ReadJSONL(bytes.NewBufferString(`{"id":"a","turn":1,"session":"s","segments":[{"seg":"x","len":3}],"output":1}`), "bad")
	assert.ErrorContains(t, err, "no turn 0")
	_, err = ReadJSONL(bytes.NewBufferString(`{"id":"a","segments":[{"seg":"x","len":3}],"output":0}`), "bad")
	assert.ErrorContains(t, err, "output must be at least 1")
}

func TestSegmentsAreDeterministicAndDistinct(t *testing.T) {
	assert.Equal(t, SegmentTokens("x", 50), SegmentTokens("x", 50))
	assert.Equal(t, SegmentTokens("x", 20), SegmentTokens("x", 50)[:20], "a shorter segment is a prefix")
	assert.NotEqual(t, SegmentTokens("x", 50), SegmentTokens("y", 50))
}

func TestWorkloadsMatchTheirSpecification(t *testing.T) {
	w1 := NewW1().Trace(1)
	assert.Len(t, w1.Requests, 64*16)
	assert.Equal(t, 2048+128, w1.Requests[0].PromptLen())
	groups := map[string]int{}
	for _, r := range w1.Requests {
		groups[r.Segments[0].Name]++
	}
	assert.Len(t, groups, 64)
	for _, n := range groups {
		assert.Equal(t, 16, n)
	}

	w2 := NewW2(1.2, 0.25)
	assert.Equal(t, int64(256*4096/4), w2.Capacity())
	counts := map[string]int{}
	for _, r := range w2.Trace(1).Requests {
		counts[r.Segments[0].Name]++
	}
	assert.Greater(t, counts["w2-sys0"], counts["w2-sys200"]*20, "Zipf 1.2 is skewed")

	w4 := NewW4().Trace(1)
	assert.InDelta(t, 200*6, len(w4.Requests), 120)
	w5 := NewW5().Trace(1)
	assert.Len(t, w5.Requests, 1024)
	assert.Equal(t, 2176, w5.Requests[0].PromptLen())
	rag := NewRAG()
	assert.Equal(t, int64(1024+64*32*384), rag.Footprint(), "the system prompt and the corpus")
	assert.Equal(t, rag.Footprint()/4, rag.Capacity())
	rt := rag.Trace(1)
	require.Len(t, rt.Requests, 4096)
	topics := map[string]int{}
	firstDocs := map[string]bool{}
	for _, r := range rt.Requests {
		require.Len(t, r.Segments, 1+4+1, "system prompt, 4 documents, question")
		assert.Equal(t, "rag-sys", r.Segments[0].Name, "one system prompt for all")
		assert.Equal(t, 1024+4*384+64, r.PromptLen())
		var topic string
		var docs []int
		for _, sg := range r.Segments[1:5] {
			var tp, d int
			_, err := fmt.Sscanf(sg.Name, "rag-t%d-d%d", &tp, &d)
			require.NoError(t, err, sg.Name)
			if topic == "" {
				topic = fmt.Sprint(tp)
			}
			assert.Equal(t, topic, fmt.Sprint(tp), "documents come from one topic cluster")
			docs = append(docs, d)
		}
		assert.True(t, slices.IsSorted(docs), "documents in rank order: %v", docs)
		assert.Len(t, slices.Compact(slices.Clone(docs)), 4, "no document twice")
		topics[topic]++
		firstDocs[r.Segments[1].Name] = true
	}
	assert.Greater(t, topics["0"], topics["63"]*5, "topic popularity is Zipf 0.8")
	shared := SharedPrefixTokens(rt, 16)
	assert.Greater(t, shared, int64(1024), "prompts share more than the system prompt")
	assert.Less(t, shared, int64(len(rt.Requests))*int64(rt.Requests[0].PromptLen())/4, "but only some leading documents")
	for _, s := range []string{"w1", "w2:0.8:0.25", "w4", "w5", "rag"} {
		w, err := ParseWorkload(s)
		require.NoError(t, err)
		assert.Equal(t, s, w.Name())
	}
	_, err := ParseWorkload("w3")
	assert.Error(t, err)
}

func TestEstimate95(t *testing.T) {
	e := Estimate95([]float64{1, 2, 3, 4, 5})
	assert.InDelta(t, 3, e.Mean, 1e-12)
	assert.InDelta(t, 2.776*math.Sqrt(2.5)/math.Sqrt(5), e.CI, 1e-9)
	assert.True(t, e.Excludes0())
	assert.False(t, Estimate95([]float64{-1, 1}).Excludes0())
	assert.InDelta(t, 0.5, quantile([]float64{0, 1}, 0.5), 1e-12)
}

func TestMatrixPairsPoliciesWithFCFSAndFindsNoGainWithoutOverlap(t *testing.T) {
	w5 := NewW5()
	w5.Requests, w5.PromptLen, w5.OutputLen = 40, 300, 8
	mx := Matrix{
		Workloads: []Workload{w5, tinyW2()},
		Policies:  []sched.Policy{sched.FCFS(), sched.KLPM(2, 0), sched.Window(4)},
		Loads:     []float64{0.9},
		Seeds:     []uint64{1, 2},
		Base:      tinyOpts(w5, sched.FCFS()),
	}
	mx.Base.CapacityTokens = 0
	calls := 0
	mx.Progress = func(done, total int) { calls++; assert.Equal(t, 2*2+2*3*1*2, total) }
	rep, err := mx.Run()
	require.NoError(t, err)
	assert.Equal(t, 16, calls)
	require.Len(t, rep.Workloads, 2)
	w := rep.Workloads[0]
	assert.Positive(t, w.Saturation)
	require.Len(t, w.Points, 3)
	assert.Nil(t, w.Points[0].GainMean, "FCFS is the reference")
	require.NotNil(t, w.Points[1].GainMean)
	assert.Zero(t, w.Points[1].GainMean.Mean, "no overlap: identical to FCFS")
	for i := range w.Points[0].Runs {
		a, b := w.Points[0].Runs[i], w.Points[1].Runs[i]
		a.SchedMicros, b.SchedMicros = 0, 0 // wall-clock
		assert.Equal(t, a, b)
	}

	dir := t.TempDir()
	paths, err := WritePlots(rep, dir, 0.85, "svg")
	require.NoError(t, err)
	assert.Len(t, paths, 6, "mean and p99 against load and the CDF, per workload")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		assert.Contains(t, string(b), "<svg", p)
		assert.Contains(t, string(b), "window", "%s has a legend", p)
	}
	paths, err = WritePlots(rep, dir, 0.85, "png")
	require.NoError(t, err)
	f, err := os.Open(paths[0])
	require.NoError(t, err)
	_, err = png.Decode(f)
	f.Close()
	assert.NoError(t, err, paths[0])
	_, err = WritePlots(rep, dir, 0.85, "gif")
	assert.ErrorContains(t, err, `plot format "gif"`)
	var buf bytes.Buffer
	require.NoError(t, rep.WriteTable(&buf))
	assert.Contains(t, buf.String(), "klpm:2")
	buf.Reset()
	require.NoError(t, rep.WriteJSON(&buf))
	assert.Contains(t, buf.String(), `"ttft_mean_gain_vs_fcfs"`)
	back, err := ReadReports(bytes.NewReader(buf.Bytes()), bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	assert.Len(t, back.Workloads, 4, "reports merge")
	assert.Equal(t, rep.Workloads[1].Points[1].Agg, back.Workloads[1].Points[1].Agg)
	buf.Reset()
	require.NoError(t, back.WriteMarkdown(&buf))
	assert.Contains(t, buf.String(), "| 0.90 | klpm:2 | 1·(older+1) |")
}

func TestCLIBuildsTheMatrixFromFlags(t *testing.T) {
	var c CLI
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	c.Register(fs)
	require.NoError(t, fs.Parse([]string{"--workloads", "w1,w2:1.2:0.5", "--policies", "fcfs,window:16", "--loads", "0.5",
		"--seeds", "2", "--beta", "1e-4", "--budget", "4096"}))
	mx, err := c.Matrix()
	require.NoError(t, err)
	assert.Len(t, mx.Workloads, 2)
	assert.Equal(t, "window:16", mx.Policies[1].String())
	assert.Equal(t, []uint64{1, 2}, mx.Seeds)
	assert.Equal(t, 1e-4, mx.Base.Cost.Beta)
	assert.Equal(t, 4096, mx.Base.TokenBudget)

	require.NoError(t, fs.Parse([]string{"--policies", "fcfs,fcfs@tiered,aged:64@tiered+prefetch+qevict", "--host-capacity", "3",
		"--disk-capacity", "0", "--pcie-h2d", "20", "--qevict-limit", "0.1"}))
	mx, err = c.Matrix()
	require.NoError(t, err)
	require.Len(t, mx.Variants, 3, "served variants replace the plain policies")
	assert.Equal(t, "aged:64@tiered+prefetch+qevict", mx.Variants[2].String())
	assert.Equal(t, Tiers{HostX: 3}, mx.Tiers)
	assert.Equal(t, 20.0, mx.Base.Link.H2D)
	assert.Equal(t, 0.1, mx.Base.QueueEvict.Limit)
	o := mx.Variants[0].apply(mx.Base, mx.Tiers)
	assert.False(t, o.Tiers.On(), "a plain policy runs on the GPU tier alone")
	o = mx.Variants[2].apply(mx.Base, mx.Tiers)
	assert.True(t, o.Tiers.On() && o.Prefetch.On && o.QueueEvict.On)

	require.NoError(t, fs.Parse([]string{"--policies", DefaultPolicies, "--full"}))
	mx, err = c.Matrix()
	require.NoError(t, err)
	assert.Len(t, mx.Workloads, 10)
	assert.Len(t, mx.Loads, 5)
	assert.Len(t, mx.Seeds, 5)

	path := filepath.Join(t.TempDir(), "w5.jsonl")
	require.NoError(t, fs.Parse([]string{"--full=false", "--workloads", "w5", "--shrink", "100", "--write-trace", path}))
	require.NoError(t, c.Run(&bytes.Buffer{}, &bytes.Buffer{}, nil))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	tr, err := ReadJSONL(f, "w5")
	require.NoError(t, err)
	assert.Len(t, tr.Requests, 10)

	for _, bad := range [][]string{{"--workloads", "w9"}, {"--policies", "lifo"}, {"--policies", "fcfs@gpu+prefetch"}, {"--policies", "fcfs@nvme"}, {"--loads", "-1"}, {"--seeds", "0"},
		{"--grid", "huge"}, {"--grid", "tiers", "--full"}} {
		var c CLI
		fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
		c.Register(fs)
		require.NoError(t, fs.Parse(bad))
		_, err := c.Matrix()
		assert.Error(t, err, "%v", bad)
	}
}

// --grid tiers is issue 18's grid; flags given explicitly override its
// parts, and -j is --workers.
func TestTheTiersGridPresetAndItsOverrides(t *testing.T) {
	var c CLI
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	c.Register(fs)
	require.NoError(t, fs.Parse([]string{"--grid", "tiers", "-j", "16"}))
	mx, err := c.Matrix()
	require.NoError(t, err)
	var names []string
	for _, w := range mx.Workloads {
		names = append(names, w.Name())
	}
	assert.Equal(t, []string{"w1", "w2:0.8:0.25", "w4", "w5", "rag"}, names)
	assert.Equal(t, []float64{0.7, 0.85, 0.95}, mx.Loads)
	assert.Len(t, mx.Seeds, 5)
	require.Len(t, mx.Variants, 10)
	assert.Equal(t, "aged:64@tiered+prefetch+qevict+recompute", mx.Variants[5].String())
	assert.Equal(t, "aged:64@tiered+prefetch+qevict+reuse", mx.Variants[7].String())
	assert.Equal(t, "aged:64@tiered+prefetch+qevict+reuse+overlap", mx.Variants[9].String())
	assert.Equal(t, 16, mx.Workers)

	c = CLI{}
	fs = flag.NewFlagSet("simulate", flag.ContinueOnError)
	c.Register(fs)
	require.NoError(t, fs.Parse([]string{"--grid", "tiers", "--shrink", "8", "--seeds", "2", "--loads", "0.85",
		"--workloads", "w2:0.8:0.25"}))
	mx, err = c.Matrix()
	require.NoError(t, err)
	require.Len(t, mx.Workloads, 1)
	assert.Len(t, mx.Workloads[0].Trace(1).Requests, 4096/8)
	assert.Equal(t, []float64{0.85}, mx.Loads)
	assert.Len(t, mx.Seeds, 2)
	assert.Len(t, mx.Variants, 10, "the preset's policies where none are given")
}

// A matrix gives the same results whatever the number of workers (they run
// the longest simulations first, which changes only when each runs), and a
// matrix of variants alone runs every one of them.
func TestMatrixResultsDoNotDependOnTheWorkers(t *testing.T) {
	w := tinyW2()
	var vs []Variant
	for _, s := range []string{"fcfs", "fcfs@tiered", "aged:64@tiered+prefetch+qevict+recompute"} {
		v, err := ParseVariant(s)
		require.NoError(t, err)
		vs = append(vs, v)
	}
	w5 := NewW5()
	w5.Requests, w5.PromptLen, w5.OutputLen = 40, 300, 8
	base := tinyOpts(w, sched.FCFS())
	base.CapacityTokens = 0
	reports := make([]*Report, 2)
	for i, workers := range []int{1, 3} {
		mx := Matrix{Workloads: []Workload{w5, w}, Variants: vs, Loads: []float64{0.8, 0.95}, Seeds: []uint64{1, 2},
			Base: base, Tiers: Tiers{HostX: 1, DiskX: 1}, Workers: workers}
		rep, err := mx.Run()
		require.NoError(t, err)
		reports[i] = rep
	}
	for wi, wp := range reports[0].Workloads {
		require.Len(t, wp.Points, len(vs)*2)
		for pi, pt := range wp.Points {
			other := reports[1].Workloads[wi].Points[pi]
			require.Len(t, pt.RunSeconds, 2)
			for si := range pt.Runs {
				a, b := pt.Runs[si], other.Runs[si]
				assert.Positive(t, a.Requests, "%s %s seed %d ran", wp.Name, pt.Policy, si)
				a.SchedMicros, b.SchedMicros = 0, 0 // wall-clock
				assert.Equal(t, a, b, "%s %s seed %d", wp.Name, pt.Policy, si)
			}
		}
	}
}
