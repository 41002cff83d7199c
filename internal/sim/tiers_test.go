package sim

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/sched"
)

// evictedPrefixTrace: "first" computes a 1024-token prefix, then 6 requests
// with prompts of their own, one at a time, push it off a 2048-token GPU,
// then "again" asks for the prefix once more. Requests are far apart, so
// nobody queues.
func evictedPrefixTrace() *Trace {
	tr := &Trace{Name: "evicted-prefix"}
	tr.Requests = append(tr.Requests, Request{ID: "first", Arrival: 0, Output: 1,
		Segments: []Segment{{Name: "shared", Len: 1024}, {Name: "q0", Len: 16}}})
	for i := 1; i <= 6; i++ {
		tr.Requests = append(tr.Requests, Request{ID: fmt.Sprintf("other%d", i), Arrival: float64(i), Output: 1,
			Segments: []Segment{{Name: fmt.Sprintf("own%d", i), Len: 1024}}})
	}
	tr.Requests = append(tr.Requests, Request{ID: "again", Arrival: 10, Output: 1,
		Segments: []Segment{{Name: "shared", Len: 1024}, {Name: "q1", Len: 16}}})
	return tr
}

func smallTierOpts(t Tiers) Options {
	o := DefaultOptions()
	o.CapacityTokens, o.TokenBudget, o.MaxBatch, o.Warmup = 2048, 1024, 8, 0
	o.Tiers = t
	o.Link.Duplex = 2 * o.Link.H2D // both directions at full rate unless a test says otherwise
	o.selfCheck = true
	return o
}

func byID(res *Result, id string) RequestResult {
	for _, r := range res.Requests {
		if r.ID == id {
			return r
		}
	}
	panic("no request " + id)
}

// A request whose prefix was offloaded to host pays the host→GPU transfer of
// its blocks, at the link's rate, instead of computing the prefix again.
func TestAPrefixOnHostPaysTheTransferNotThePrefill(t *testing.T) {
	tr := evictedPrefixTrace()
	gpu := run(t, tr, smallTierOpts(Tiers{}))
	host := run(t, tr, smallTierOpts(Tiers{HostX: 4}))

	g, h := byID(gpu, "again"), byID(host, "again")
	assert.Equal(t, 0, g.Reused, "GPU only: the prefix was evicted and is computed again")
	assert.Equal(t, [3]int{0, 1024, 0}, h.ReusedByLevel, "tiered: the whole prefix is reused from host")
	assert.Equal(t, 1024, h.Reused)
	link := DefaultLink()
	assert.InDelta(t, 1024*link.BytesPerToken/(link.H2D*1e9), h.Transfer(), 1e-9,
		"the transfer is the prefix's bytes over host→GPU bandwidth")
	assert.Zero(t, g.Transfer(), "nothing to transfer on the GPU tier alone")
	assert.Less(t, h.TTFT(), g.TTFT(), "55 GB/s of onboarding beats 1024 tokens of prefill")
	assert.Greater(t, host.Moved[0][1], int64(0), "the prefix was offloaded to host")
	assert.Equal(t, int64(1024/16), host.Moved[1][0], "and only the prefix came back")
}

// While offloads run GPU→host, onboarding shares the link: each direction
// gets at most half of the duplex rate.
func TestOnboardingSharesTheLinkWithOffloads(t *testing.T) {
	tr := evictedPrefixTrace()
	o := smallTierOpts(Tiers{HostX: 4})
	o.Link.Duplex = 40
	res := run(t, tr, o)
	h := byID(res, "again")
	require.Equal(t, 1024, h.ReusedByLevel[1])
	assert.InDelta(t, 1024*o.Link.BytesPerToken/(20*1e9), h.Transfer(), 1e-9,
		"the prefix came in while its own Resume offloaded blocks to make room: 20 GB/s, not 55")
}

// With a disk level behind host, a prefix pushed to disk comes back through
// a disk read and then host→GPU, and pays both.
func TestAPrefixOnDiskPaysTheDiskReadAndTheCopy(t *testing.T) {
	tr := evictedPrefixTrace()
	res := run(t, tr, smallTierOpts(Tiers{HostX: 1, DiskX: 4, DiskDir: t.TempDir()}))
	h := byID(res, "again")
	require.Equal(t, 1024, h.Reused)
	require.Positive(t, h.ReusedByLevel[2], "some of the prefix was on disk")
	link := DefaultLink()
	b := 16 * link.BytesPerToken
	disk := float64(h.ReusedByLevel[2] / 16)
	host := float64(h.ReusedByLevel[1] / 16)
	assert.InDelta(t, max(disk*b/(link.DiskRead*1e9)+b/(link.H2D*1e9), (disk+host)*b/(link.H2D*1e9)), h.Transfer(), 1e-6,
		"disk blocks are read and each copied host→GPU once read, with the host blocks: the last lands a block's copy after the last read")
	assert.Positive(t, res.Moved[1][2]+res.Moved[0][2], "blocks went down to disk")
}

// Compute overlaps transfers: while one request onboards, the others keep
// computing, and nothing that was not cold waits for the link.
func TestTieredRunsFinishWithTheSameRequestsAndChargeOnlyColdReuse(t *testing.T) {
	w := tinyW2()
	tr := w.Trace(3).TimeScaled(0.05)
	for _, p := range []sched.Policy{sched.FCFS(), sched.Default()} {
		o := tinyOpts(w, p)
		o.CapacityTokens /= 2
		o.Tiers, o.selfCheck = Tiers{HostX: 2}, true
		res := run(t, tr, o)
		for _, r := range res.Requests {
			if r.ReusedByLevel[1]+r.ReusedByLevel[2] == 0 {
				assert.Zero(t, r.Transfer(), "%s reused nothing cold", r.ID)
			}
			assert.Equal(t, r.Reused, r.ReusedByLevel[0]+r.ReusedByLevel[1]+r.ReusedByLevel[2])
			assert.InDelta(t, r.TTFT(), r.Queueing()+r.Transfer()+r.Prefill(), 1e-9)
		}
	}
}

// queuedBehindAHog is evictedPrefixTrace with a long request admitted just
// before "again": with one request at a time, "again" waits for it.
func queuedBehindAHog() *Trace {
	tr := evictedPrefixTrace()
	tr.Requests = append(tr.Requests, Request{ID: "hog", Arrival: 9.9, Output: 400,
		Segments: []Segment{{Name: "hog", Len: 16}}})
	return tr
}

// A request that waits while its prefix is on host has the prefix prefetched
// to the GPU: admitted, it finds the prefix there and waits for no transfer.
func TestPrefetchBringsAWaitingRequestsHostPrefixToTheGPU(t *testing.T) {
	tr := queuedBehindAHog()
	o := smallTierOpts(Tiers{HostX: 4})
	o.MaxBatch = 1
	plain := run(t, tr, o)
	o.Prefetch.On, o.Prefetch.Pages = true, 1
	pre := run(t, tr, o)

	p, q := byID(plain, "again"), byID(pre, "again")
	require.Positive(t, p.Queueing(), "again waits behind the hog")
	assert.Equal(t, [3]int{0, 1024, 0}, p.ReusedByLevel, "without prefetch the prefix is still on host at admission")
	assert.Positive(t, p.Transfer())
	assert.Equal(t, [3]int{1024, 0, 0}, q.ReusedByLevel, "with prefetch it is on the GPU")
	assert.Zero(t, q.Transfer(), "and the transfer was done while it waited")
	assert.Equal(t, int64(1024/16), pre.Prefetched)
	assert.Less(t, q.TTFT(), p.TTFT())

	// With room for a quarter of the GPU's 128 pages, the first 32 blocks.
	o.Prefetch.Pages = 0.25
	part := byID(run(t, tr, o), "again")
	assert.Equal(t, [3]int{512, 512, 0}, part.ReusedByLevel, "the pages budget bounds the prefetch, from the prefix's start")
}

// Prefetch never takes a page a running request holds or has reserved, and
// keeps the blocks prefetched for waiters within its pages budget: the
// engine checks both after every step (selfCheck) under a backlog, with a
// budget small enough to bind.
func TestPrefetchNeverTakesPagesARunningRequestHolds(t *testing.T) {
	w := tinyW2()
	tr := w.Trace(5).TimeScaled(0.01)
	for _, pages := range []float64{0.02, 0.25, 1} {
		o := tinyOpts(w, sched.FCFS())
		o.CapacityTokens = 1536 // 96 pages: running requests hold most of them
		o.Tiers = Tiers{HostX: 1, DiskX: 2, DiskDir: t.TempDir()}
		o.Prefetch = PrefetchOptions{On: true, Pages: pages, Horizon: 1}
		o.selfCheck = true
		res := run(t, tr, o)
		if pages == 1 {
			assert.Positive(t, res.Prefetched, "a backlog leaves time to prefetch")
		}
	}
}

// Bad prefetch and tier settings are refused, naming the setting.
func TestBadTierAndPrefetchSettingsAreRefused(t *testing.T) {
	tr := evictedPrefixTrace()
	o := smallTierOpts(Tiers{HostX: -1})
	_, err := Run(tr, o)
	assert.ErrorContains(t, err, "tier sizes")
	o = smallTierOpts(Tiers{HostX: 1})
	o.Prefetch = PrefetchOptions{On: true, Pages: 0, Horizon: 0.05}
	_, err = Run(tr, o)
	assert.ErrorContains(t, err, "prefetch pages")
	o = smallTierOpts(Tiers{HostX: 1})
	o.Link.DiskRead = 0
	_, err = Run(tr, o)
	assert.ErrorContains(t, err, "disk read")
}

// Variants parse as POLICY[@SERVING] and print back the same way.
func TestVariantsParseAndPrint(t *testing.T) {
	for _, s := range []string{"fcfs", "aged:64@tiered", "window:8@tiered+prefetch", "fcfs@tiered+recompute",
		"aged:64@tiered+prefetch+qevict+recompute", "fcfs@tiered+reuse", "fcfs@gpu+reuse",
		"aged:64@tiered+prefetch+qevict+reuse+recompute", "fcfs@tiered+overlap",
		"aged:64@tiered+prefetch+qevict+reuse+overlap"} {
		v, err := ParseVariant(s)
		require.NoError(t, err)
		assert.Equal(t, s, v.String())
	}
	v, err := ParseVariant("fcfs@gpu")
	require.NoError(t, err)
	assert.Equal(t, "fcfs", v.String())
	_, err = ParseVariant("fcfs@nvme")
	assert.ErrorContains(t, err, "serving")
	_, err = ParseVariant("fcfs@gpu+recompute")
	assert.ErrorContains(t, err, "tiered only", "nothing to read back on the GPU tier alone")
	_, err = ParseVariant("fcfs@tiered+recompute+qevict")
	assert.ErrorContains(t, err, "serving", "suffixes come in one order")
	_, err = ParseVariant("fcfs@tiered+reuse+qevict")
	assert.ErrorContains(t, err, "serving", "suffixes come in one order")
	_, err = ParseVariant("fcfs@gpu+overlap")
	assert.ErrorContains(t, err, "tiered only", "nothing to read beside the run on the GPU tier alone")
	_, err = ParseVariant("fcfs@tiered+overlap+recompute")
	assert.ErrorContains(t, err, "serving", "overlap and recompute both choose what to recompute: one of them")
	_, err = ParseVariant("fcfs@tiered+overlap+reuse")
	assert.ErrorContains(t, err, "serving", "suffixes come in one order")
}

// diskPrefixTrace is evictedPrefixTrace with a third request for the prefix
// at t = 20, and options that leave part of it on disk (one chunk a step,
// whatever is reused).
func diskPrefixTrace(t *testing.T) (*Trace, Options) {
	tr := evictedPrefixTrace()
	tr.Requests = append(tr.Requests, Request{ID: "later", Arrival: 20, Output: 1,
		Segments: []Segment{{Name: "shared", Len: 1024}, {Name: "q2", Len: 16}}})
	o := smallTierOpts(Tiers{HostX: 1, DiskX: 4, DiskDir: t.TempDir()})
	o.TokenBudget = 4096
	return tr, o
}

// With the engine idle, admission computes a run of the disk part of a
// prefix while the rest is read: the first token comes sooner than reading
// it all and sooner than recomputing the disk part, the run's blocks replace
// their disk copies (a later request reuses the whole prefix from the GPU),
// and the transfer time is when both the run and the read were done.
func TestAnIdleEngineComputesARunWhileTheRestIsRead(t *testing.T) {
	tr, o := diskPrefixTrace(t)
	read := run(t, tr, o)
	o.Recompute = true
	rec := run(t, tr, o)
	o.Recompute, o.Overlap = false, true
	ov := run(t, tr, o)

	r, c, v := byID(read, "again"), byID(rec, "again"), byID(ov, "again")
	require.Positive(t, r.ReusedByLevel[2], "some of the prefix is on disk")
	assert.Positive(t, ov.Recomputed, "a run was computed")
	assert.Less(t, ov.Recomputed, int64(r.ReusedByLevel[2]/16), "and part of the disk blocks read beside it")
	assert.Positive(t, v.ReusedByLevel[2], "the rest of the disk part is read")
	assert.Equal(t, r.ReusedByLevel[1], v.ReusedByLevel[1], "the host part is read as before")
	assert.Equal(t, 1024-int(ov.Recomputed)*16, v.Reused, "what is reused excludes the run")
	assert.Less(t, v.TTFT(), r.TTFT(), "sooner than reading the whole prefix")
	assert.Less(t, v.TTFT(), c.TTFT(), "sooner than recomputing the disk part")
	runAlone := prefillTime(o, int(ov.Recomputed)*16, r.ReusedByLevel[1])
	assert.GreaterOrEqual(t, v.Transfer(), runAlone-1e-9, "ready once the run is computed")
	assert.Equal(t, [3]int{1024, 0, 0}, byID(ov, "later").ReusedByLevel, "run and tail are on the GPU now")
}

// prefillTime is the cost model's time to prefill u tokens after p in one
// step, alone.
func prefillTime(o Options, u, p int) float64 {
	var sc stepCost
	sc.prefill(u, p)
	return o.Cost.step(&sc)
}

// Where reading is faster than computing (a fast disk), no run is computed:
// the run is the same as without overlap.
func TestAFastReadNeedsNoRun(t *testing.T) {
	tr, o := diskPrefixTrace(t)
	o.Link.DiskRead = 50
	read := run(t, tr, o)
	o.Overlap = true
	ov := run(t, tr, o)
	assert.Zero(t, ov.Recomputed)
	assert.Equal(t, read.Requests, ov.Requests)
}

// With requests waiting for their first token behind it, a run would delay
// each of them: admission computes a shorter one than when idle, or none.
func TestTheRunWeighsTheDelayItImposesOnOthers(t *testing.T) {
	tr, o := diskPrefixTrace(t)
	o.Overlap = true
	idle := run(t, tr, o)
	for i := 0; i < 6; i++ {
		tr.Requests = append(tr.Requests, Request{ID: fmt.Sprintf("crowd%d", i), Arrival: 10, Output: 1,
			Segments: []Segment{{Name: fmt.Sprintf("crowd%d", i), Len: 64}}})
	}
	o.MaxBatch = 16
	crowd := run(t, tr, o)
	require.Positive(t, idle.Recomputed)
	assert.Less(t, crowd.Recomputed, idle.Recomputed)
}

// Overlap needs cold levels and excludes recompute.
func TestOverlapSettingsAreChecked(t *testing.T) {
	tr := evictedPrefixTrace()
	o := smallTierOpts(Tiers{})
	o.Overlap = true
	_, err := Run(tr, o)
	assert.ErrorContains(t, err, "overlap")
	o = smallTierOpts(Tiers{HostX: 1})
	o.Overlap, o.Recompute = true, true
	_, err = Run(tr, o)
	assert.ErrorContains(t, err, "overlap")
}

// With the engine idle and a disk read slower a token than prefill (the
// defaults), admission recomputes the part of a prefix on disk instead of
// reading it, and the sooner first token is worth it; the recomputed blocks
// replace their disk copies, so a later request reuses them from the GPU.
func TestAnIdleEngineRecomputesAPrefixSlowerToReadThanToCompute(t *testing.T) {
	tr := evictedPrefixTrace()
	tr.Requests = append(tr.Requests, Request{ID: "later", Arrival: 20, Output: 1,
		Segments: []Segment{{Name: "shared", Len: 1024}, {Name: "q2", Len: 16}}})
	o := smallTierOpts(Tiers{HostX: 1, DiskX: 4, DiskDir: t.TempDir()})
	o.TokenBudget = 4096 // one chunk, whatever is reused
	read := run(t, tr, o)
	o.Recompute = true
	rec := run(t, tr, o)

	r, c := byID(read, "again"), byID(rec, "again")
	require.Positive(t, r.ReusedByLevel[2], "some of the prefix is on disk")
	assert.Zero(t, c.ReusedByLevel[2], "with the choice, nothing is read from disk")
	assert.Equal(t, int64(r.ReusedByLevel[2]/16), rec.Recomputed)
	assert.Less(t, c.TTFT(), r.TTFT())
	assert.Equal(t, [3]int{1024, 0, 0}, byID(rec, "later").ReusedByLevel, "the recomputed blocks are on the GPU now")
}

// Where reading is faster than computing (a fast disk), admission reads: the
// run is the same as without the choice.
func TestAFastReadIsNeverRecomputed(t *testing.T) {
	tr := evictedPrefixTrace()
	o := smallTierOpts(Tiers{HostX: 1, DiskX: 4, DiskDir: t.TempDir()})
	o.Link.DiskRead = 50
	read := run(t, tr, o)
	o.Recompute = true
	rec := run(t, tr, o)
	assert.Zero(t, rec.Recomputed)
	assert.Equal(t, read.Requests, rec.Requests)
}

// When other requests wait for their first token, a recompute would delay
// each of them: admission weighs that and reads the prefix from disk.
func TestRecomputingWeighsTheDelayItImposesOnOthers(t *testing.T) {
	tr := evictedPrefixTrace()
	for i := 0; i < 6; i++ {
		tr.Requests = append(tr.Requests, Request{ID: fmt.Sprintf("crowd%d", i), Arrival: 10, Output: 1,
			Segments: []Segment{{Name: fmt.Sprintf("crowd%d", i), Len: 64}}})
	}
	o := smallTierOpts(Tiers{HostX: 1, DiskX: 4, DiskDir: t.TempDir()})
	o.Recompute, o.MaxBatch, o.TokenBudget = true, 16, 4096
	c := byID(run(t, tr, o), "again")
	assert.Equal(t, 1024, c.Reused, "six requests wait behind it: the prefix is read")
	assert.Positive(t, c.ReusedByLevel[2])
}

// waitingPrefixTrace: "first" caches a 1024-token prefix, "filler" a prompt
// of its own after it; then "hog" runs alone (one request at a time) and
// grows by 400 decoded tokens while "again", which wants the prefix, waits.
// The GPU (2048 tokens) is full, so the hog evicts.
func waitingPrefixTrace() *Trace {
	return &Trace{Name: "waiting-prefix", Requests: []Request{
		{ID: "first", Arrival: 0, Output: 1, Segments: []Segment{{Name: "shared", Len: 1024}, {Name: "q0", Len: 16}}},
		{ID: "filler", Arrival: 1, Output: 1, Segments: []Segment{{Name: "filler", Len: 976}}},
		{ID: "hog", Arrival: 9.99, Output: 400, Segments: []Segment{{Name: "hog", Len: 16}}},
		{ID: "again", Arrival: 10, Output: 1, Segments: []Segment{{Name: "shared", Len: 1024}, {Name: "q1", Len: 16}}},
	}}
}

// Blocks a waiting request will reuse are evicted after blocks nobody waits
// for, although LRU would take them first.
func TestQueueAwareEvictionKeepsTheBlocksWaitersWillReuse(t *testing.T) {
	tr := waitingPrefixTrace()
	o := smallTierOpts(Tiers{})
	o.MaxBatch = 1
	lru := run(t, tr, o)
	o.QueueEvict.On = true
	qa := run(t, tr, o)

	l, q := byID(lru, "again"), byID(qa, "again")
	require.Positive(t, l.Queueing(), "again waits behind the hog")
	assert.Less(t, l.Reused, 1024, "LRU evicts the older prefix while again waits")
	assert.Equal(t, 1024, q.Reused, "queue-aware eviction takes the filler's blocks instead")
	assert.Less(t, q.TTFT(), l.TTFT())
	assert.Equal(t, 1024/16, qa.Protected)
}

// Reuse-aware eviction does not undo queue-aware eviction's protection: the
// shared prefix, reused by nobody yet, is one-off like the filler's blocks
// and, with reuse-aware eviction alone, goes first as under LRU; with both,
// the waiter's prefix keeps its raised priority and is reused whole.
func TestQueueAwareEvictionProtectsOverReuseAwareEviction(t *testing.T) {
	tr := waitingPrefixTrace()
	o := smallTierOpts(Tiers{})
	o.MaxBatch = 1
	o.ReuseEvict.On = true
	alone := run(t, tr, o)
	o.QueueEvict.On = true
	both := run(t, tr, o)
	assert.Less(t, byID(alone, "again").Reused, 1024, "one-off like the filler, the older prefix goes first")
	assert.Equal(t, 1024, byID(both, "again").Reused, "protected while again waits")
}

// However many requests wait, queue-aware eviction raises at most
// Limit × the GPU capacity blocks at once.
func TestQueueAwareEvictionIsBoundedUnderAFloodOfWaiters(t *testing.T) {
	w := tinyW2()
	tr := w.Trace(5).TimeScaled(0.001) // a backlog: almost everyone waits
	for _, limit := range []float64{0, 0.05, 0.3} {
		o := tinyOpts(w, sched.FCFS())
		o.QueueEvict = QueueEvictOptions{On: true, Limit: limit, Priority: 70}
		o.selfCheck = true
		res := run(t, tr, o)
		bound := int(limit * float64(res.CapacityBlocks))
		assert.LessOrEqual(t, res.Protected, bound, "limit %v", limit)
		if limit > 0 {
			assert.Equal(t, bound, res.Protected, "limit %v: the waiters want more than the limit, which binds", limit)
		}
	}
}

// Reuse-aware eviction keeps a prefix that was reused where LRU evicts it
// for blocks nobody reused: "second" reuses the shared prefix, then six
// requests of prompts of their own push it off the GPU under LRU; with
// +reuse their one-off blocks go first and "again" reuses it all.
func TestReuseAwareEvictionKeepsAReusedPrefixOverOneOffBlocks(t *testing.T) {
	tr := evictedPrefixTrace()
	tr.Requests = append(tr.Requests[:1], append([]Request{{ID: "second", Arrival: 0.5, Output: 1,
		Segments: []Segment{{Name: "shared", Len: 1024}, {Name: "q2", Len: 16}}}}, tr.Requests[1:]...)...)
	o := smallTierOpts(Tiers{})
	lru := run(t, tr, o)
	o.ReuseEvict.On = true
	re := run(t, tr, o)
	assert.Less(t, byID(lru, "again").Reused, 1024, "LRU evicts the older prefix")
	assert.Equal(t, 1024, byID(re, "again").Reused, "reuse-aware eviction takes the one-off blocks instead")
	assert.Equal(t, 1024, byID(re, "second").Reused)
	assert.Less(t, byID(re, "again").TTFT(), byID(lru, "again").TTFT())
}

// However popular the prefixes, reuse-aware eviction ranks at most
// Limit × the GPU capacity blocks above the default at once, and the limit
// binds when the workload's reuse wants more.
func TestReuseAwareEvictionIsBounded(t *testing.T) {
	w := tinyW2()
	tr := w.Trace(5).TimeScaled(0.05)
	for _, limit := range []float64{0, 0.05, 0.2} {
		o := tinyOpts(w, sched.FCFS())
		o.Tiers = Tiers{HostX: 1, DiskX: 1, DiskDir: t.TempDir()}
		o.ReuseEvict = ReuseEvictOptions{On: true, Limit: limit, HalfLife: 1024}
		o.selfCheck = true
		res := run(t, tr, o)
		bound := int(limit * float64(res.CapacityBlocks))
		assert.LessOrEqual(t, res.Raised, bound, "limit %v", limit)
		if limit > 0 {
			assert.Equal(t, bound, res.Raised, "limit %v binds", limit)
		}
	}
	o := tinyOpts(w, sched.FCFS())
	o.ReuseEvict = ReuseEvictOptions{On: true, Limit: -1, HalfLife: 1024}
	_, err := Run(tr, o)
	assert.ErrorContains(t, err, "reuse-aware eviction limit")
}

// Without reuse (W5) the cold levels, prefetch, queue-aware eviction and
// the choice to recompute change no request's timing: offloads delay nothing but onboarding, and
// there is nothing to onboard.
func TestWithoutReuseTheTiersChangeNothing(t *testing.T) {
	w := NewW5().Shrink(16)
	tr := w.Trace(2).TimeScaled(0.2)
	o := DefaultOptions()
	o.CapacityTokens = 16384
	gpu := run(t, tr, o)
	o.Tiers, o.Prefetch.On, o.QueueEvict.On, o.ReuseEvict.On, o.Recompute = Tiers{HostX: 1, DiskX: 1, DiskDir: t.TempDir()}, true, true, true, true
	tiered := run(t, tr, o)
	assert.Equal(t, gpu.Requests, tiered.Requests)
	assert.Positive(t, tiered.Moved[0][1], "blocks were offloaded all the same")
	o.Recompute, o.Overlap = false, true
	assert.Equal(t, gpu.Requests, run(t, tr, o).Requests, "nor does overlap")
}

// A matrix of variants pairs each point with every FCFS variant, the first
// one first.
func TestMatrixGainsAgainstEveryFCFSVariant(t *testing.T) {
	w := tinyW2()
	var vs []Variant
	for _, s := range []string{"fcfs", "fcfs@tiered", "aged:64@tiered+prefetch+qevict"} {
		v, err := ParseVariant(s)
		require.NoError(t, err)
		vs = append(vs, v)
	}
	base := tinyOpts(w, sched.FCFS())
	base.CapacityTokens = 0
	mx := Matrix{Workloads: []Workload{w}, Variants: vs, Loads: []float64{0.9}, Seeds: []uint64{1, 2},
		Base: base, Tiers: Tiers{HostX: 2}, Workers: 1}
	rep, err := mx.Run()
	require.NoError(t, err)
	pts := rep.Workloads[0].Points
	require.Len(t, pts, 3)
	assert.Equal(t, []string{"fcfs", "fcfs@tiered", "aged:64@tiered+prefetch+qevict"},
		[]string{pts[0].Policy, pts[1].Policy, pts[2].Policy})
	require.Len(t, pts[0].Gains, 1)
	assert.Equal(t, "fcfs@tiered", pts[0].Gains[0].Against)
	require.Len(t, pts[2].Gains, 2)
	assert.Equal(t, "fcfs", pts[2].Gains[0].Against)
	assert.Equal(t, pts[2].Gains[0].Mean, *pts[2].GainMean, "the first FCFS variant's gain is GainMean")
	assert.Equal(t, "fcfs@tiered", pts[2].Gains[1].Against)
	var buf bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&buf))
	assert.Contains(t, buf.String(), "vs fcfs@tiered")
}

// Host blocks issued while a disk prefix is still being read do not wait
// for the disk: the disk blocks' copies to the GPU follow their reads, and
// the host blocks share the host→GPU channel with them.
func TestHostBlocksDoNotWaitBehindADiskRead(t *testing.T) {
	l := link{cfg: DefaultLink(), blockBytes: 16 * DefaultLink().BytesPerToken}
	b, h2d, read := l.blockBytes, l.cfg.H2D*1e9, l.cfg.DiskRead*1e9
	disk := [3][3]int64{2: {0: 64}}
	diskReady := l.issue(&disk, 0)
	assert.InDelta(t, 64*b/read+b/h2d, diskReady, 1e-9, "the reads, then the last block's copy")
	host := [3][3]int64{1: {0: 64}}
	hostReady := l.issue(&host, 0.001)
	assert.InDelta(t, 128*b/h2d, hostReady, 1e-9, "behind the disk blocks' copies only, not their reads")
	assert.Less(t, hostReady, diskReady)
}
