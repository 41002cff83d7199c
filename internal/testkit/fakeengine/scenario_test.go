package fakeengine_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// workload is a seeded shared-prefix workload: groups of requests whose
// prompts share a system prompt, some of them follow-up turns of an earlier
// request of their group, in shuffled order.
type workload struct {
	groups, perGroup         int
	system, question, output int
	scopes                   int // requests spread over this many reuse scopes
}

func (w workload) requests(rng *rand.Rand) []fakeengine.Request {
	var out []fakeengine.Request
	for g := range w.groups {
		system := randTokens(rng, w.system+rng.IntN(w.system/4+1))
		scope := blockhash.Scope{LoRAID: int64(g % max(w.scopes, 1))}
		for range w.perGroup {
			q := randTokens(rng, 1+rng.IntN(w.question))
			out = append(out, fakeengine.Request{Scope: scope, Prompt: concat(system, q), OutputLen: rng.IntN(w.output + 1)})
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

type scenario struct {
	name string
	setup
	workload
	inFlight int // sessions in flight at most
	skip     string
}

// runInterleaved serves the workload with up to inFlight sessions, choosing
// at random which session steps, suspends or resumes next. A session that
// cannot get pages or is refused a resume is preempted: closed and started
// again later, reusing what it committed. Every resume verifies every
// position the cache holds, and every request is verified in full before it
// closes.
func runInterleaved(t *testing.T, sc scenario) {
	r := newRig(t, sc.setup)
	rng := rand.New(rand.NewPCG(uint64(sc.seed), 77))
	pending := sc.requests(rng)
	total := len(pending)
	streams := make([]device.Stream, sc.inFlight)
	for i := range streams {
		streams[i] = r.stream()
	}
	type slot struct {
		s      *fakeengine.Session
		req    fakeengine.Request
		active bool
	}
	slots := make([]*slot, sc.inFlight)
	served, preempted, suspends := 0, 0, 0
	preempt := func(i int) {
		require.NoError(t, slots[i].s.Close())
		pending = append(pending, slots[i].req)
		slots[i] = nil
		preempted++
	}
	for iter := 0; served < total; iter++ {
		require.Less(t, iter, 200000, "no progress: %d of %d served", served, total)
		i := rng.IntN(sc.inFlight)
		sl := slots[i]
		switch {
		case sl == nil:
			if len(pending) == 0 {
				continue
			}
			req := pending[0]
			pending = pending[1:]
			s, err := r.e.Start(req)
			require.NoError(t, err)
			slots[i] = &slot{s: s, req: req}
		case !sl.active:
			v, err := sl.s.Resume(streams[i])
			if isRetryable(err) {
				preempt(i)
				continue
			}
			require.NoError(t, err)
			require.Zero(t, v.Mismatches, "first: %v", v.First)
			sl.active = true
		case rng.IntN(8) == 0:
			require.NoError(t, sl.s.Suspend())
			sl.active = false
			suspends++
		default:
			done, err := sl.s.Advance()
			if isRetryable(err) {
				preempt(i)
				continue
			}
			require.NoError(t, err)
			if done {
				v, err := sl.s.Verify()
				require.NoError(t, err)
				require.Zero(t, v.Mismatches, "first: %v", v.First)
				require.Positive(t, v.PagesVerified)
				require.NoError(t, sl.s.Close())
				slots[i] = nil
				served++
			}
		}
	}
	st := r.e.Stats()
	ms := r.m.Stats()
	t.Logf("%s: %d requests, %d preemptions, %d suspends; %d pages verified, %d skipped; hit rate %.2f, %d evictions",
		sc.name, served, preempted, suspends, st.PagesVerified, st.PagesSkipped, ms.HitRate(), ms.Evictions)
	assert.Zero(t, st.Mismatches, "first: %v", st.FirstMismatch)
	assert.Positive(t, st.PagesVerified)
	assert.Positive(t, ms.ReusedBlocks)
	assert.Zero(t, ms.LostPages)
	r.requireDrained()
	if sc.slots > 0 {
		assert.Positive(t, ms.Evictions, "the quota should force evictions")
	}
	if sc.hostSlots > 0 || sc.diskSlots > 0 {
		mig := r.m.MigrationStats()
		t.Logf("%s: migrations %v", sc.name, mig)
		onboard := mig[core.HostToHot].Pages + mig[core.DiskToHot].Pages
		assert.Positive(t, onboard, "pages came back from a cold tier (and verified)")
	}
	if sc.diskSlots > 0 {
		mig := r.m.MigrationStats()
		assert.Positive(t, mig[core.HostToDisk].Pages+mig[core.HotToDisk].Pages, "pages reached the disk tier")
	}
}

func TestInterleavedScenarios(t *testing.T) {
	base := workload{groups: 8, perGroup: 6, system: 120, question: 40, output: 12, scopes: 2}
	for _, sc := range []scenario{
		{name: "full-attention", setup: setup{seed: 1, slots: 48, maxDelay: 20 * time.Microsecond,
			engine: fakeengine.Options{ChunkTokens: 32}}, workload: base, inFlight: 4},
		{name: "sliding-window", setup: setup{seed: 2, slots: 48, window: 48, sinks: 4, maxDelay: 20 * time.Microsecond,
			engine: fakeengine.Options{ChunkTokens: 40}}, workload: base, inFlight: 4},
		{name: "tight", setup: setup{seed: 3, slots: 24, window: 64, maxDelay: 10 * time.Microsecond, maxUtil: 0.8,
			engine: fakeengine.Options{ChunkTokens: 64}}, workload: base, inFlight: 6},
		{name: "partial-reuse", setup: setup{seed: 6, slots: 40, partial: true, maxDelay: 20 * time.Microsecond,
			engine: fakeengine.Options{ChunkTokens: 32}}, workload: base, inFlight: 4,
		},
		{name: "partial-reuse-roomy", setup: setup{seed: 6, partial: true, maxDelay: 20 * time.Microsecond,
			engine: fakeengine.Options{ChunkTokens: 32}}, workload: base, inFlight: 4},
		{name: "host-tier", setup: setup{seed: 7, slots: 40, hostSlots: 80, window: 48, maxDelay: 20 * time.Microsecond,
			engine: fakeengine.Options{ChunkTokens: 32}}, workload: base, inFlight: 5},
		{name: "host-disk-half", setup: setup{seed: 8, slots: 40, hostSlots: 32, diskSlots: 96, half: true,
			maxDelay: 20 * time.Microsecond, engine: fakeengine.Options{ChunkTokens: 32, ZeroLowBytes: true}},
			workload: base, inFlight: 5},
		{name: "tpb-8", setup: setup{seed: 4, tpb: 8, slots: 96, maxDelay: 10 * time.Microsecond,
			engine: fakeengine.Options{ChunkTokens: 24, ZeroLowBytes: true}}, workload: base, inFlight: 3},
	} {
		t.Run(sc.name, func(t *testing.T) {
			if sc.skip != "" {
				t.Skip(sc.skip)
			}
			t.Parallel()
			runInterleaved(t, sc)
		})
	}
}

// TestConcurrentServe serves a workload from several goroutines at once, each
// with its own stream, through Serve: the manager's lock and the engine's
// scratch pool under the race detector. A request that finds no room backs off
// and is served again later.
func TestConcurrentServe(t *testing.T) {
	for _, host := range []int64{0, 64} {
		t.Run(fmt.Sprintf("host-slots=%d", host), func(t *testing.T) {
			t.Parallel()
			testConcurrentServe(t, host)
		})
	}
}

func testConcurrentServe(t *testing.T, hostSlots int64) {
	const workers = 4
	w := workload{groups: 8, perGroup: 4, system: 100, question: 30, output: 8}
	// One request needs at most ceil((125+30+8)/16) = 11 blocks; room for
	// every worker's request, not for every system prompt.
	r := newRig(t, setup{seed: 5, slots: 64, hostSlots: hostSlots, maxDelay: 20 * time.Microsecond,
		engine: fakeengine.Options{ChunkTokens: 48}})
	reqs := w.requests(rand.New(rand.NewPCG(5, 5)))
	work := make(chan fakeengine.Request, len(reqs))
	for _, q := range reqs {
		work <- q
	}
	close(work)
	var mu sync.Mutex
	outputs := map[string][]config.Token{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		stream := r.stream()
		wg.Go(func() {
			for q := range work {
				for attempt := 0; ; attempt++ {
					res, err := r.e.Serve(stream, q)
					if isRetryable(err) && attempt < 1000 {
						time.Sleep(100 * time.Microsecond)
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					if n := res.Verified.Mismatches + res.Final.Mismatches; n > 0 {
						errs <- fmt.Errorf("%d mismatches: %v %v", n, res.Verified.First, res.Final.First)
						return
					}
					mu.Lock()
					outputs[fmt.Sprint(q.Prompt)] = res.Tokens
					mu.Unlock()
					break
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, outputs, len(reqs))
	for _, q := range reqs {
		out := outputs[fmt.Sprint(q.Prompt)]
		require.Len(t, out, len(q.Prompt)+q.OutputLen)
	}
	st := r.e.Stats()
	ms := r.m.Stats()
	t.Logf("%d requests; %d pages verified; hit rate %.2f, %d evictions", len(reqs), st.PagesVerified, ms.HitRate(), ms.Evictions)
	assert.Zero(t, st.Mismatches, "first: %v", st.FirstMismatch)
	assert.Positive(t, st.PagesVerified)
	assert.Positive(t, ms.Evictions)
	r.requireDrained()
}

// TestEvictedBlocksAreRecomputed: with room for one request only, a request
// whose prefix was evicted reuses nothing, recomputes it, and still verifies.
func TestEvictedBlocksAreRecomputed(t *testing.T) {
	r := newRig(t, setup{slots: 10})
	rng := rand.New(rand.NewPCG(21, 22))
	a, b := randTokens(rng, 150), randTokens(rng, 150)
	stream := r.stream()
	for i, p := range [][]config.Token{a, b, a, a} {
		res, err := r.e.Serve(stream, fakeengine.Request{Prompt: concat(p, []config.Token{config.Token(i)}), OutputLen: 4})
		require.NoError(t, err)
		switch i {
		case 0, 1, 2:
			assert.Zero(t, res.Reused, "request %d", i)
		case 3:
			assert.Equal(t, 144, res.Reused)
			assert.Equal(t, int64(9), res.Verified.PagesVerified)
		}
	}
	assert.Zero(t, r.e.Mismatches())
	assert.Positive(t, r.m.Stats().Evictions)
	r.requireDrained()
}

// TestPartialReuseVerifies: with partial reuse, the matching head of a cached
// block is copied into a private page, and the copy verifies.
func TestPartialReuseVerifies(t *testing.T) {
	r := newRig(t, setup{partial: true})
	a := randTokens(rand.New(rand.NewPCG(31, 32)), 40)
	stream := r.stream()
	_, err := r.e.Serve(stream, fakeengine.Request{Prompt: a, OutputLen: 0})
	require.NoError(t, err)
	res, err := r.e.Serve(stream, fakeengine.Request{Prompt: concat(a[:27], []config.Token{7, 8}), OutputLen: 3})
	require.NoError(t, err)
	assert.Equal(t, 27, res.Reused, "16 shared + 11 copied")
	assert.Equal(t, int64(2), res.Verified.PagesVerified)
	assert.Zero(t, res.Verified.Mismatches)
	// The trailing partial block of the first request was published at close.
	res, err = r.e.Serve(stream, fakeengine.Request{Prompt: concat(a, []config.Token{1}), OutputLen: 1})
	require.NoError(t, err)
	assert.Equal(t, 40, res.Reused)
	assert.Zero(t, r.e.Mismatches())
	r.requireDrained()
}

// TestPartialReuseUnderPressure: making room for the partial copy must never
// evict its source or the shared path. With two GPU slots and no colder
// level there is no room for the copy at all: partial reuse is skipped and
// only the full block is shared. With a host tier the shared block moves down
// (it comes back on resume) and the copy goes ahead.
func TestPartialReuseUnderPressure(t *testing.T) {
	for _, sc := range []struct {
		name   string
		reused int
		setup
	}{
		{"gpu-only", 16, setup{partial: true, slots: 2, noSlidingLyr: true}},
		{"host-half", 24, setup{partial: true, slots: 2, hostSlots: 8, half: true, window: 32,
			engine: fakeengine.Options{ZeroLowBytes: true}}},
		{"host-default-codec", 24, setup{partial: true, slots: 2, hostSlots: 8, window: 32}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			r := newRig(t, sc.setup)
			a := randTokens(rand.New(rand.NewPCG(33, 34)), 32)
			stream := r.stream()
			_, err := r.e.Serve(stream, fakeengine.Request{Prompt: a, OutputLen: 0})
			require.NoError(t, err)
			res, err := r.e.Serve(stream, fakeengine.Request{Prompt: concat(a[:24], []config.Token{999}), OutputLen: 0})
			require.NoError(t, err)
			assert.Equal(t, sc.reused, res.Reused)
			assert.Zero(t, res.Verified.Mismatches, "first: %v", res.Verified.First)
			assert.Zero(t, r.e.Mismatches())
			r.requireDrained()
		})
	}
}

// TestColdTierRoundTripVerifies: pages evicted to the host tier through the
// Half codec come back on reuse; they verify exactly when the data is what
// Half keeps losslessly (zero low bytes), and the engine notices the loss
// otherwise.
func TestColdTierRoundTripVerifies(t *testing.T) {
	for _, zeroLow := range []bool{true, false} {
		t.Run(fmt.Sprintf("zero-low-bytes=%v", zeroLow), func(t *testing.T) {
			r := newRig(t, setup{slots: 12, hostSlots: 64, half: true, noSlidingLyr: true,
				engine: fakeengine.Options{ZeroLowBytes: zeroLow}})
			rng := rand.New(rand.NewPCG(41, 42))
			a, b := randTokens(rng, 150), randTokens(rng, 150)
			stream := r.stream()
			for _, p := range [][]config.Token{a, b} {
				_, err := r.e.Serve(stream, fakeengine.Request{Prompt: p, OutputLen: 2})
				require.NoError(t, err)
			}
			require.Positive(t, r.m.MigrationStats()[core.HotToHost].Pages, "b pushed a's blocks to the host tier")
			res, err := r.e.Serve(stream, fakeengine.Request{Prompt: concat(a[:140], []config.Token{3}), OutputLen: 2})
			require.NoError(t, err)
			require.Equal(t, 128, res.Reused)
			require.Positive(t, r.m.MigrationStats()[core.HostToHot].Pages)
			if zeroLow {
				assert.Zero(t, res.Verified.Mismatches, "first: %v", res.Verified.First)
				assert.Equal(t, int64(8), res.Verified.PagesVerified)
			} else {
				assert.Positive(t, res.Verified.Mismatches)
				require.NotNil(t, res.Verified.First)
				assert.Zero(t, res.Verified.First.Offset%2, "Half zeroes the even (low) bytes")
				assert.Zero(t, res.Verified.First.Got)
			}
			r.requireDrained()
		})
	}
}

// TestRecomputedBlocksRefillEvictedPages: when one layer group's page of a
// cached block is evicted while the other's survives, a request that
// recomputes the block must put its page back, or the prefix is never
// reusable again. Here the windowed group's pages of a prompt are evicted by
// a long request; the prompt's full-attention pages stay. core/kvcache.go
// publish adopts a recomputed block's pages only into a new node or one with
// no pages at all, so every later request with this prompt recomputes it.
func TestRecomputedBlocksRefillEvictedPages(t *testing.T) {
	r := newRig(t, setup{window: 32, engine: fakeengine.Options{ChunkTokens: 16},
		tweak: func(c *config.Config) {
			// 36 full-attention slots, 14 windowed ones.
			c.InitialPoolRatio = []float64{40 * 56.0 / (40*56 + 4*16), 4 * 16.0 / (40*56 + 4*16)}
			c.CacheTiers[0].Quota = 16 * (40*56 + 4*16)
		}})
	rng := rand.New(rand.NewPCG(1, 1))
	a := randTokens(rng, 97)
	stream := r.stream()
	_, err := r.e.Serve(stream, fakeengine.Request{Prompt: a})
	require.NoError(t, err)
	// 19 blocks: the windowed group cycles through all its slots, the full
	// attention one keeps a's pages.
	_, err = r.e.Serve(stream, fakeengine.Request{Prompt: randTokens(rng, 300)})
	require.NoError(t, err)
	for i := range 3 {
		res, err := r.e.Serve(stream, fakeengine.Request{Prompt: concat(a[:96], []config.Token{config.Token(i + 5)})})
		require.NoError(t, err)
		if i > 0 {
			assert.Equal(t, 96, res.Reused, "request %d: its predecessor recomputed and committed the prefix", i)
		}
	}
	assert.Zero(t, r.e.Mismatches())
}

// TestResumeAloneIsNotRefused: with the GPU tier alone, a suspended cache
// holding nearly every slot resumes: its own pages do not count towards the
// utilization that MaxUtilForResume bounds.
func TestResumeAloneIsNotRefused(t *testing.T) {
	r := newRig(t, setup{slots: 10, noSlidingLyr: true})                                                           // 12 slots of 56*16 bytes
	s, err := r.e.Start(fakeengine.Request{Prompt: randTokens(rand.New(rand.NewPCG(51, 52)), 182), OutputLen: 10}) // 12 blocks
	require.NoError(t, err)
	defer s.Close()
	stream := r.stream()
	_, err = s.Resume(stream)
	require.NoError(t, err)
	for done := false; !done; {
		done, err = s.Advance()
		require.NoError(t, err)
	}
	require.NoError(t, s.Suspend())
	_, err = s.Resume(stream)
	require.NoError(t, err, "the only cache, suspended a moment ago, resumes")
}

// TestPartialTailPublishedAtTheStopVerifies: with partial reuse, a cache whose
// commits stop (isEnd) publishes its trailing partial block at once, as
// KVCacheManagerV2 commits it; a second cache reuses it while the first is
// still open and decoding past it, and the copy holds the committed tokens'
// KV (the publication is fenced by the work that wrote them).
func TestPartialTailPublishedAtTheStopVerifies(t *testing.T) {
	r := newRig(t, setup{partial: true, maxDelay: time.Millisecond, seed: 5})
	a := randTokens(rand.New(rand.NewPCG(41, 42)), 44)
	stream := r.stream()
	c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: a[:40]})
	require.NoError(t, err)
	require.NoError(t, c.Resume(stream))
	require.NoError(t, c.Resize(44, 0))
	require.NoError(t, r.e.Step(c, a, 0, 40))
	require.NoError(t, c.Commit(a[:40], true))
	require.NoError(t, r.e.Step(c, a, 40, 44), "decoding on past the stop")
	res, err := r.e.Serve(stream, fakeengine.Request{Prompt: concat(a[:40], []config.Token{1}), OutputLen: 1})
	require.NoError(t, err)
	assert.Equal(t, 40, res.Reused, "32 shared + the 8 of the partial block, published at the stop")
	assert.Zero(t, res.Verified.Mismatches)
	require.NoError(t, c.Close())
	assert.Zero(t, r.e.Mismatches())
	r.requireDrained()
}
