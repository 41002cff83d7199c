package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/cp"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/core/sched"
)

// Index selects the CP-aware index a run uses.
type Index string

const (
	// IndexNone: no index; the scheduler falls back to cp.Null and caches
	// notify nobody.
	IndexNone Index = "none"
	// IndexNull: cp.Null, wired to the scheduler and to the caches.
	IndexNull Index = "null"
	// IndexManager: cp.ManagerBacked over the run's manager.
	IndexManager Index = "manager"
)

// Options configures a run. Start from DefaultOptions.
type Options struct {
	Policy sched.Policy
	Index  Index
	Cost   CostModel
	// TokenBudget is the most tokens (prefill chunks plus one per decoding
	// request) one step computes.
	TokenBudget int
	// MaxBatch is the most requests running at once.
	MaxBatch int
	// TokensPerBlock is the manager's block size.
	TokensPerBlock int
	// CapacityTokens is the GPU KV capacity; 0 takes the workload's.
	CapacityTokens int64
	// Warmup is the fraction of requests, in arrival order, left out of the
	// metrics.
	Warmup float64
	// LevelWeights configures the manager-backed index (nil: defaults).
	LevelWeights []float64
	// Tiers are the cold levels under the GPU (zero: none), Link the cost
	// of moving blocks between levels.
	Tiers Tiers
	Link  Link
	// Prefetch brings waiting requests' cold prefixes to the GPU.
	Prefetch PrefetchOptions
	// QueueEvict evicts the blocks waiting requests will reuse last.
	QueueEvict QueueEvictOptions
	// ReuseEvict evicts blocks nobody reused first and popular ones last.
	ReuseEvict ReuseEvictOptions
	// Recompute lets admission recompute the part of a request's cached
	// prefix that would take longer to bring to the GPU than to compute,
	// counting the delay the extra prefill imposes on the requests still
	// waiting for their first token (see engine.cheapestReuse), instead of
	// always reading all of it.
	Recompute bool
	// Overlap lets admission recompute a run of a request's cached prefix
	// on the GPU while the cold blocks after it come up from host or disk
	// (the manager's fresh run, core.CacheOptions.FreshBlocks), the run
	// chosen so that both finish together as far as the delay its prefill
	// imposes on the others allows (see engine.overlapRun). It excludes
	// Recompute.
	Overlap bool
	// selfCheck makes every step verify that running requests keep their
	// pages on the GPU and their reservations covered (tests).
	selfCheck bool
}

// DefaultOptions: FCFS, manager-backed index, default cost model, budget
// 8192, batch 256, 16 tokens a block, 10% warm-up, GPU tier only (the
// default link and prefetch budgets apply once tiers and prefetch are on).
func DefaultOptions() Options {
	return Options{
		Policy: sched.FCFS(), Index: IndexManager, Cost: DefaultCost(),
		TokenBudget: 8192, MaxBatch: 256, TokensPerBlock: 16, Warmup: 0.1,
		Link: DefaultLink(), Prefetch: DefaultPrefetch(), QueueEvict: DefaultQueueEvict(),
		ReuseEvict: DefaultReuseEvict(),
	}
}

// RequestResult is what happened to one request. Times are in seconds.
type RequestResult struct {
	ID      string  `json:"id"`
	Arrival float64 `json:"arrival"`
	Admit   float64 `json:"admit"`
	// Ready is when the request's reused blocks were all on the GPU: its
	// admission, unless some had to come from a cold level.
	Ready      float64 `json:"ready"`
	FirstToken float64 `json:"first_token"`
	Finish     float64 `json:"finish"`
	Prompt     int     `json:"prompt"`
	Reused     int     `json:"reused"`
	// ReusedByLevel splits Reused by the level each block was on when the
	// request was admitted (0 GPU, 1 host, 2 disk).
	ReusedByLevel [3]int `json:"reused_by_level"`
	Bypassed      int    `json:"bypassed"`
}

// TTFT is the time to first token: queueing, transfer and prefill.
func (r RequestResult) TTFT() float64 { return r.FirstToken - r.Arrival }

// Queueing is the time from arrival to admission.
func (r RequestResult) Queueing() float64 { return r.Admit - r.Arrival }

// Transfer is the time from admission until the reused blocks are on the
// GPU (what is left of their onboarding once the request is admitted).
func (r RequestResult) Transfer() float64 { return r.Ready - r.Admit }

// Prefill is the time from the reused blocks being on the GPU to the first
// token.
func (r RequestResult) Prefill() float64 { return r.FirstToken - r.Ready }

// Result is one run.
type Result struct {
	Trace  string
	Policy string
	// Requests, every one, in arrival order; the first Skip are warm-up.
	Requests []RequestResult
	Skip     int
	Steps    int
	SimTime  float64
	// Evictions counts pages the manager evicted during the whole run.
	Evictions int64
	// Moved counts blocks moved between levels, Moved[from][to], and
	// BlockBytes is what the link charged for one.
	Moved      [3][3]int64
	BlockBytes float64
	// Prefetched counts blocks prefetch brought to the GPU; Protected is
	// the most blocks queue-aware eviction raised at once; Recomputed
	// counts cached blocks admission chose to recompute rather than read
	// (with Overlap, those of the fresh runs).
	Prefetched int64
	Recomputed int64
	Protected  int
	// Raised is the most blocks reuse-aware eviction ranked above the
	// default priority at once.
	Raised         int
	CapacityBlocks int64
	SchedTime      time.Duration
	Sched          sched.Stats
}

// Measured returns the requests after the warm-up.
func (r *Result) Measured() []RequestResult { return r.Requests[r.Skip:] }

type phase int

const (
	waiting phase = iota
	// onboarding: admitted, its reused blocks still on their way to the GPU.
	onboarding
	prefilling
	decoding
	finished
)

type job struct {
	idx         int
	req         *Request
	prompt      []config.Token
	full        []config.Token
	chain       []blockhash.Key // keys of the prompt's full blocks before its last token's, hashed at arrival
	cache       *cp.TrackedCache
	pins        []blockhash.Key
	phase       phase
	p, l        int
	reused      int
	computed    int
	committed   int
	capBlocks   int
	totalBlocks int
	generated   int
	chunk       int
	arrival     float64
	admitT      float64
	readyT      float64
	firstT      float64
	byLevel     [3]int
	prefetched  int
	bypass      int
	// runFrom and runTo are the fresh run the request computes first
	// (tokens; equal: none), prefixEnd the end of its cached prefix; inRun
	// while the run is being computed.
	runFrom, runTo int
	prefixEnd      int
	inRun          bool
}

// chunkEnd is where the request's next prefill chunk must stop: the end of
// its fresh run while it computes one, of its prompt otherwise.
func (j *job) chunkEnd() int {
	if j.inRun {
		return j.runTo
	}
	return j.p
}

type engine struct {
	opts    Options
	tr      *Trace
	m       *core.Manager
	stream  device.Stream
	tracker *cp.Tracker
	sch     *sched.Scheduler
	tpb     int

	// The simulator's own mirror of the tree, from the manager's events,
	// and the pages running requests pin: admission control is exact.
	// cached maps each cached block to its level.
	cached     map[blockhash.Key]int
	pins       map[blockhash.Key]int
	committing *job
	// moves counts blocks moved by the manager call in progress; link
	// charges them. readyAt is when a prefetched block reaches the GPU.
	moves     [3][3]int64
	link      link
	readyAt   map[blockhash.Key]float64
	levels    levelIndex
	prefetchN int // blocks prefetched for requests still waiting
	// protected holds, per waiting request, the chain whose priority
	// queue-aware eviction raised.
	protected map[string][]blockhash.Key
	// guarded is the set of blocks queue-aware eviction protects now (the
	// union of protected's chains); reuse is reuse-aware eviction's policy,
	// nil when it is off.
	guarded map[blockhash.Key]struct{}
	reuse   *cp.ReuseEvict
	diskDir string

	jobs        []job
	byID        map[string]*job
	running     []*job
	outstanding int
	budget      int
	t           float64
	open        []int
	nextOpen    int
	followups   arrivals
	nextTurn    []int
	done        int
	err         error
	res         Result
}

// Run simulates the trace under opts. It is deterministic for a given trace
// and options (only Result.SchedTime, a wall-clock measure, varies).
func Run(tr *Trace, opts Options) (*Result, error) {
	if err := tr.Validate(); err != nil {
		return nil, err
	}
	if err := opts.Policy.Validate(); err != nil {
		return nil, err
	}
	switch {
	case opts.TokenBudget <= opts.MaxBatch:
		return nil, fmt.Errorf("sim: token budget %d must exceed max batch %d", opts.TokenBudget, opts.MaxBatch)
	case opts.MaxBatch < 1 || opts.TokensPerBlock < 1 || opts.CapacityTokens < 1:
		return nil, errors.New("sim: max batch, tokens per block and capacity must be positive")
	case opts.Warmup < 0 || opts.Warmup >= 1:
		return nil, fmt.Errorf("sim: warm-up fraction %v out of [0, 1)", opts.Warmup)
	case opts.Tiers.HostX < 0 || opts.Tiers.DiskX < 0:
		return nil, fmt.Errorf("sim: tier sizes must not be negative, got host %v disk %v", opts.Tiers.HostX, opts.Tiers.DiskX)
	case opts.QueueEvict.On && !(opts.QueueEvict.Limit >= 0 && opts.QueueEvict.Limit <= 1 &&
		opts.QueueEvict.Priority > core.DefaultPriority && opts.QueueEvict.Priority <= core.MaxPriority):
		return nil, fmt.Errorf("sim: queue-aware eviction limit %v must be in [0, 1] and priority %d in (%d, %d]",
			opts.QueueEvict.Limit, opts.QueueEvict.Priority, core.DefaultPriority, core.MaxPriority)
	case opts.ReuseEvict.On && !(opts.ReuseEvict.Limit >= 0 && opts.ReuseEvict.HalfLife >= 1):
		return nil, fmt.Errorf("sim: reuse-aware eviction limit %v must not be negative and half-life %d at least 1",
			opts.ReuseEvict.Limit, opts.ReuseEvict.HalfLife)
	case opts.Overlap && (opts.Recompute || !opts.Tiers.On()):
		return nil, errors.New("sim: overlap needs tiers and excludes recompute")
	case opts.Prefetch.On && !(opts.Prefetch.Pages > 0 && opts.Prefetch.Pages <= 1 && opts.Prefetch.Horizon >= 0):
		return nil, fmt.Errorf("sim: prefetch pages %v must be in (0, 1] and horizon %v not negative",
			opts.Prefetch.Pages, opts.Prefetch.Horizon)
	}
	if opts.Tiers.On() {
		if err := opts.Link.Validate(); err != nil {
			return nil, err
		}
	}
	e := &engine{opts: opts, tr: tr, tpb: opts.TokensPerBlock,
		cached: map[blockhash.Key]int{}, pins: map[blockhash.Key]int{}, readyAt: map[blockhash.Key]float64{},
		protected: map[string][]blockhash.Key{}}
	e.link = link{cfg: opts.Link, blockBytes: float64(opts.TokensPerBlock) * opts.Link.BytesPerToken}
	if err := e.init(); err != nil {
		return nil, err
	}
	defer e.close()
	for e.done < len(e.jobs) && e.err == nil {
		e.step()
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.result(), nil
}

func (e *engine) init() error {
	blocks := (e.opts.CapacityTokens + int64(e.tpb) - 1) / int64(e.tpb)
	tiers := []config.CacheTierConfig{config.GPU(blocks * 8)}
	if x := e.opts.Tiers.HostX; x > 0 {
		tiers = append(tiers, config.Host(int64(math.Ceil(x*float64(blocks)))*8))
	}
	if x := e.opts.Tiers.DiskX; x > 0 {
		dir := e.opts.Tiers.DiskDir
		if dir == "" {
			d, err := os.MkdirTemp("", "kvcm-sim-disk-")
			if err != nil {
				return fmt.Errorf("sim: disk tier directory: %w", err)
			}
			e.diskDir, dir = d, d
		}
		tiers = append(tiers, config.Disk(int64(math.Ceil(x*float64(blocks)))*8, dir))
	}
	cfg := config.Config{
		TokensPerBlock: e.tpb,
		CacheTiers:     tiers,
		Layers: []config.AttentionLayerConfig{{LayerID: 0, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: 8},
		}}},
		MaxUtilForResume: 1,
	}
	listen := core.WithEventListener(e.onEvent)
	var index cp.CPAwareKVManager
	var err error
	switch e.opts.Index {
	case IndexManager:
		var mb *cp.ManagerBacked
		e.m, mb, err = cp.NewManagerWithIndex(cfg, cp.ManagerBackedOptions{
			LevelWeights: e.opts.LevelWeights,
			KnownChain: func(id string) []blockhash.Key {
				if j := e.byID[id]; j != nil {
					return j.chain
				}
				return nil
			},
		}, listen)
		index, e.levels = mb, mb
	case IndexNull, IndexNone, "":
		e.m, err = core.NewManager(cfg, listen)
		if e.opts.Index == IndexNull {
			index = cp.Null{}
		}
	default:
		return fmt.Errorf("sim: unknown index %q (none, null, manager)", e.opts.Index)
	}
	if err != nil {
		e.removeDiskDir()
		return err
	}
	if e.stream, err = e.m.Device().NewStream(); err != nil {
		e.removeDiskDir()
		e.m.Close()
		return err
	}
	st, err := e.m.StorageStats(layout.GPULevel)
	if err != nil {
		e.close()
		return err
	}
	for _, g := range st {
		e.res.CapacityBlocks += g.Total
	}
	if ro := e.opts.ReuseEvict; ro.On {
		o := cp.DefaultReuseOptions(int(ro.Limit * float64(e.res.CapacityBlocks)))
		o.HalfLife = ro.HalfLife
		if e.reuse, err = cp.NewReuseEvict(o); err != nil {
			e.close()
			return err
		}
	}
	e.tracker = cp.NewTracker(e.m, index)
	clock := sched.WithClock(func() time.Duration { return time.Duration(e.t * float64(time.Second)) })
	if e.sch, err = sched.New(e.opts.Policy, index, clock); err != nil {
		e.close()
		return err
	}

	n := len(e.tr.Requests)
	e.jobs = make([]job, n)
	e.byID = make(map[string]*job, n)
	e.nextTurn = make([]int, n)
	turnIdx := map[string]map[int]int{}
	for i := range e.tr.Requests {
		r := &e.tr.Requests[i]
		j := &e.jobs[i]
		j.idx, j.req, j.p, j.l = i, r, r.PromptLen(), r.Output
		j.totalBlocks = (j.p + j.l - 1 + e.tpb - 1) / e.tpb
		if int64(j.totalBlocks) > e.res.CapacityBlocks {
			e.close()
			return fmt.Errorf("sim: request %q needs %d blocks, more than the capacity of %d",
				r.ID, j.totalBlocks, e.res.CapacityBlocks)
		}
		e.byID[r.ID] = j
		e.nextTurn[i] = -1
		if r.Session != "" {
			if turnIdx[r.Session] == nil {
				turnIdx[r.Session] = map[int]int{}
			}
			turnIdx[r.Session][r.Turn] = i
		}
		if r.Turn == 0 {
			e.open = append(e.open, i)
		}
	}
	for i := range e.tr.Requests {
		r := &e.tr.Requests[i]
		if r.Turn > 0 {
			e.nextTurn[turnIdx[r.Session][r.Turn-1]] = i
		}
	}
	sort.SliceStable(e.open, func(a, b int) bool {
		return e.tr.Requests[e.open[a]].Arrival < e.tr.Requests[e.open[b]].Arrival
	})
	e.res.Trace, e.res.Policy = e.tr.Name, e.opts.Policy.String()
	return nil
}

func (e *engine) close() {
	for _, j := range e.running {
		j.cache.Close()
	}
	e.running = nil
	if e.stream != nil {
		e.stream.Close()
	}
	e.m.Close()
	e.removeDiskDir()
}

func (e *engine) removeDiskDir() {
	if e.diskDir != "" {
		os.RemoveAll(e.diskDir)
		e.diskDir = ""
	}
}

// onEvent keeps the simulator's mirror; it runs with the manager's lock held.
func (e *engine) onEvent(ev core.CacheEvent) {
	switch ev.Kind {
	case core.BlockStored:
		e.cached[ev.Key] = int(ev.Level)
		if j := e.committing; j != nil {
			// The committing request's own page now backs the block.
			j.pins = append(j.pins, ev.Key)
			e.pins[ev.Key]++
		}
	case core.BlockRemoved:
		delete(e.cached, ev.Key)
		if e.reuse != nil {
			e.reuse.Removed(ev.Key)
		}
		delete(e.readyAt, ev.Key)
	case core.BlockUpdated:
		// One layer group: a block's page is the block.
		if ev.Level < 0 || ev.Level > 2 {
			break
		}
		if _, ok := e.cached[ev.Key]; ok {
			e.cached[ev.Key] = int(ev.Level)
		}
		if ev.Level != layout.GPULevel {
			delete(e.readyAt, ev.Key)
		}
		if ev.OldLevel >= 0 && ev.OldLevel <= 2 {
			e.moves[ev.OldLevel][ev.Level]++
		}
	}
}

// charge charges the blocks the last manager calls moved and returns when
// those brought to the GPU have arrived (now if none).
func (e *engine) charge() float64 { return e.link.issue(&e.moves, e.t) }

func (e *engine) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *engine) available() int {
	st, err := e.m.StorageStats(layout.GPULevel)
	if err != nil {
		e.fail(err)
		return 0
	}
	var a int64
	for _, g := range st {
		a += g.Available
	}
	return int(a)
}

// nextArrival returns the time of the next arrival, or +Inf.
func (e *engine) nextArrival() float64 {
	t := math.Inf(1)
	if e.nextOpen < len(e.open) {
		t = e.tr.Requests[e.open[e.nextOpen]].Arrival
	}
	if len(e.followups) > 0 {
		t = min(t, e.followups[0].t)
	}
	return t
}

// enqueueArrivals moves every request that arrived by now to the queue, in
// arrival order.
func (e *engine) enqueueArrivals() {
	for {
		var idx int
		var at float64
		switch {
		case e.nextOpen < len(e.open) && e.tr.Requests[e.open[e.nextOpen]].Arrival <= e.t &&
			(len(e.followups) == 0 || e.tr.Requests[e.open[e.nextOpen]].Arrival <= e.followups[0].t):
			idx = e.open[e.nextOpen]
			at = e.tr.Requests[idx].Arrival
			e.nextOpen++
		case len(e.followups) > 0 && e.followups[0].t <= e.t:
			a := heap.Pop(&e.followups).(arrival)
			idx, at = a.idx, a.t
		default:
			return
		}
		j := &e.jobs[idx]
		j.arrival = at
		j.prompt = j.req.PromptTokens()
		usable := max(j.p-1, 0) / e.tpb * e.tpb
		j.chain = blockhash.Chain(blockhash.Scope{}, e.tpb, j.prompt[:usable])
		e.sch.Enqueue(j.req.ID, j.prompt)
	}
}

// step runs one engine step: admit, allocate, compute, commit, finish.
func (e *engine) step() {
	e.enqueueArrivals()
	if len(e.running) == 0 && e.sch.Len() == 0 {
		next := e.nextArrival()
		if math.IsInf(next, 1) {
			e.fail(fmt.Errorf("sim: %d of %d requests never arrived", len(e.jobs)-e.done, len(e.jobs)))
			return
		}
		e.t = next
		return
	}
	for _, j := range e.running {
		if j.phase == onboarding && j.readyT <= e.t {
			j.phase = prefilling
		}
	}
	e.budget = e.opts.TokenBudget
	for _, j := range e.running {
		if j.phase == decoding {
			e.budget--
		}
	}
	for _, j := range e.running {
		if j.phase == prefilling {
			j.chunk = min(j.chunkEnd()-j.computed, e.budget)
			e.budget -= j.chunk
		}
	}
	if e.budget > 0 && len(e.running) < e.opts.MaxBatch && e.sch.Len() > 0 {
		start := time.Now()
		adm := e.sch.Admit(e.offer)
		e.res.SchedTime += time.Since(start)
		for _, a := range adm {
			e.byID[a.ID].bypass = a.Bypassed
		}
	}
	if e.opts.QueueEvict.On && (e.sch.Len() > 0 || len(e.protected) > 0) && e.err == nil {
		e.protectQueue()
	}
	if e.opts.Prefetch.On && e.sch.Len() > 0 && e.err == nil {
		e.prefetch()
	}
	if e.opts.selfCheck && e.err == nil {
		e.checkRunning()
	}
	if e.err != nil {
		return
	}
	if len(e.running) == 0 {
		// Cannot happen: with nothing running the whole capacity is free.
		e.fail(fmt.Errorf("sim: nothing admissible at t=%.3f with %d waiting", e.t, e.sch.Len()))
		return
	}

	var sc stepCost
	for _, j := range e.running {
		n := 1
		if j.phase == onboarding {
			continue
		}
		if j.phase == prefilling {
			n = j.chunk
			if n == 0 {
				continue
			}
			sc.prefill(n, j.computed)
		} else {
			sc.decode(j.computed + 1)
		}
		if need := (j.computed + n + e.tpb - 1) / e.tpb; need > j.capBlocks {
			if err := j.cache.Resize(need*e.tpb, -1); err != nil {
				e.fail(fmt.Errorf("sim: request %q: %w (admission control should prevent this)", j.req.ID, err))
				return
			}
			e.outstanding -= need - j.capBlocks
			j.capBlocks = need
		}
	}
	e.charge()
	if sc == (stepCost{}) {
		// Every running request is onboarding: wait for the first to be
		// ready, or for an arrival.
		next := e.nextArrival()
		for _, j := range e.running {
			next = min(next, j.readyT)
		}
		e.t = next
		return
	}
	e.t += e.opts.Cost.step(&sc)
	e.res.Steps++

	kept := e.running[:0]
	for _, j := range e.running {
		switch j.phase {
		case prefilling:
			if j.chunk == 0 {
				break
			}
			j.computed += j.chunk
			if j.inRun && j.computed == j.runTo {
				e.endRun(j)
				break
			}
			if j.computed == j.p {
				j.phase, j.firstT, j.generated = decoding, e.t, 1
				j.full = append(j.prompt, j.req.OutputTokens()...)
			}
			e.commit(j)
		case decoding:
			j.computed++
			j.generated++
		}
		if j.phase == decoding && j.generated == j.l {
			// Generated blocks are published when the request ends: nobody
			// can reuse them earlier, and one commit is cheaper than many.
			e.commit(j)
			e.finish(j)
			continue
		}
		kept = append(kept, j)
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// commit publishes the full blocks computed so far.
func (e *engine) commit(j *job) {
	target := j.computed / e.tpb * e.tpb
	if target <= j.committed {
		return
	}
	src := j.full
	if src == nil {
		src = j.prompt
	}
	history := j.computed
	if j.inRun {
		// The cache's history is its whole cached prefix already.
		history = -1
	}
	if err := j.cache.Resize(j.capBlocks*e.tpb, history); err != nil {
		e.fail(err)
		return
	}
	e.committing = j
	err := j.cache.Commit(src[j.committed:target], false)
	e.committing = nil
	e.charge()
	if err != nil {
		e.fail(err)
		return
	}
	j.committed = target
}

// offer tries to admit a waiting request this step.
func (e *engine) offer(id string) bool {
	j := e.byID[id]
	if len(e.running) >= e.opts.MaxBatch || e.budget <= 0 || e.err != nil {
		return false
	}
	reused := 0
	var byLevel [3]int
	for reused < len(j.chain) {
		lv, ok := e.cached[j.chain[reused]]
		if !ok {
			break
		}
		byLevel[lv]++
		reused++
	}
	input, recomputed := j.prompt, 0
	if e.opts.Recompute && byLevel[1]+byLevel[2] > 0 {
		if cut := e.cheapestReuse(j, reused); cut < reused {
			recomputed = reused - cut
			reused, byLevel = cut, [3]int{}
			for _, k := range j.chain[:cut] {
				byLevel[e.cached[k]]++
			}
			// The manager reuses the longest cached prefix of its input:
			// cut short, it reuses exactly the cut.
			input = j.prompt[:cut*e.tpb]
		}
	}
	opts := core.CacheOptions{InputTokens: input}
	runFrom, runTo := 0, 0
	if e.opts.Overlap && byLevel[1]+byLevel[2] > 0 {
		if f, k := e.overlapRun(j, reused); k > 0 {
			runFrom, runTo = f, f+k
			opts.FreshFromBlock, opts.FreshBlocks = f, k
		}
	}
	inRun := func(b int) bool { return b >= runFrom && b < runTo }
	for b := runFrom; b < runTo; b++ {
		byLevel[e.cached[j.chain[b]]]--
	}
	unpinned, gpuKept := 0, 0
	for b, k := range j.chain[:reused] {
		if e.cached[k] == 0 && !inRun(b) {
			gpuKept++
			if e.pins[k] == 0 {
				unpinned++
			}
		}
	}
	// Blocks on cold levels come to the GPU at Resume and a fresh run's
	// get new pages: they need pages now.
	need := j.totalBlocks - gpuKept
	if e.available()-e.outstanding-unpinned < need {
		return false
	}
	c, err := e.tracker.CreateWithKeys(id, opts, j.chain)
	if err != nil {
		e.fail(err)
		return false
	}
	if f, t := c.FreshRange(); c.ReusedTokens() != reused*e.tpb || f != runFrom*e.tpb || t != runTo*e.tpb {
		c.Close()
		e.fail(fmt.Errorf("sim: request %q reuses %d tokens with fresh run [%d, %d), the mirror predicted %d with [%d, %d)",
			id, c.ReusedTokens(), f, t, reused*e.tpb, runFrom*e.tpb, runTo*e.tpb))
		return false
	}
	if err := c.Resume(e.stream); err != nil {
		c.Close()
		e.fail(err)
		return false
	}
	ready := e.charge()
	for b, k := range j.chain[:reused] {
		if r, ok := e.readyAt[k]; ok && !inRun(b) {
			ready = max(ready, r)
		}
	}
	e.prefetchN -= j.prefetched
	j.prefetched = 0
	j.cache, j.phase, j.admitT, j.readyT = c, prefilling, e.t, ready
	j.prefixEnd, j.capBlocks = reused*e.tpb, reused
	j.runFrom, j.runTo, j.inRun = runFrom*e.tpb, runTo*e.tpb, runTo > runFrom
	j.pins = make([]blockhash.Key, 0, reused)
	for b, k := range j.chain[:reused] {
		if inRun(b) {
			continue
		}
		j.pins = append(j.pins, k)
		e.pins[k]++
	}
	recomputed += runTo - runFrom
	e.res.Recomputed += int64(recomputed)
	j.byLevel = byLevel
	j.reused = (reused - (runTo - runFrom)) * e.tpb
	j.computed, j.committed = j.prefixEnd, j.prefixEnd
	if j.inRun {
		j.computed, j.committed = j.runFrom, j.runFrom
	}
	e.outstanding += j.totalBlocks - reused
	j.chunk = 0
	if ready > e.t && !j.inRun {
		j.phase = onboarding
	} else {
		j.chunk = min(j.chunkEnd()-j.computed, e.budget)
		e.budget -= j.chunk
	}
	e.running = append(e.running, j)
	if e.reuse != nil {
		e.setPriorities(e.reuse.Admitted(j.chain[:reused])...)
		e.res.Raised = max(e.res.Raised, e.reuse.Raised())
	}
	return true
}

// endRun commits a request's fresh run once it is computed: the manager
// joins the cached tail, and the request waits for the tail's blocks if
// they are still coming. Its Ready time is when both were done.
func (e *engine) endRun(j *job) {
	e.commit(j)
	if e.err != nil {
		return
	}
	if n := j.cache.NumCommittedTokens(); n != j.prefixEnd {
		e.fail(fmt.Errorf("sim: request %q: its fresh run's commit left %d tokens committed, not the prefix's %d", j.req.ID, n, j.prefixEnd))
		return
	}
	j.inRun = false
	j.computed, j.committed = j.prefixEnd, j.prefixEnd
	j.readyT = max(j.readyT, e.t)
	if j.readyT > e.t {
		j.phase = onboarding
	}
}

// overlapRun returns the fresh run [f, f+k) of j's first reused cached
// blocks to compute on the GPU while the cold blocks after it are read, if
// j is admitted now (k = 0: none). It starts at the first block on disk, or
// without one at the first not on the GPU (those before it are reused where
// they are: a host block comes up at PCIe speed, beside the disk reads), and
// leaves at least one block to read. Of every k it takes the one that minimizes when the
// prefix is ready — the later of the run's prefill alone and the arrival
// of the cold blocks after it (the link as booked now; blocks prefetch has
// in flight when they land) — plus the run's prefill once for every other
// request waiting or not yet at its first token (the delay its extra
// computing imposes on them, as cheapestReuse counts it); ties keep the
// shorter run.
func (e *engine) overlapRun(j *job, reused int) (int, int) {
	f := slices.IndexFunc(j.chain[:reused], func(k blockhash.Key) bool { return e.cached[k] == 2 })
	if f < 0 {
		f = slices.IndexFunc(j.chain[:reused], func(k blockhash.Key) bool { return e.cached[k] != 0 })
	}
	if reused-f < 2 {
		return f, 0
	}
	others := e.sch.Len() - 1
	for _, r := range e.running {
		if r.phase == onboarding || r.phase == prefilling {
			others++
		}
	}
	// The blocks read, k = 0 first: every cold one of the prefix; flight[k]
	// is when the prefetched ones among those read with a run of k land.
	pre := e.t
	for _, k := range j.chain[:f] {
		if r, ok := e.readyAt[k]; ok {
			pre = max(pre, r)
		}
	}
	host, disk := 0, 0
	flight := make([]float64, reused-f+1)
	flight[reused-f] = pre
	for b := reused - 1; b >= f; b-- {
		flight[b-f] = flight[b-f+1]
		if r, ok := e.readyAt[j.chain[b]]; ok {
			flight[b-f] = max(flight[b-f], r)
		}
	}
	for _, k := range j.chain[:reused] {
		switch e.cached[k] {
		case 1:
			host++
		case 2:
			disk++
		}
	}
	best, bestT := 0, max(flight[0], e.link.arrival(host, disk, e.t))
	for k := 1; k < reused-f; k++ {
		switch e.cached[j.chain[f+k-1]] {
		case 1:
			host--
		case 2:
			disk--
		}
		run := e.prefillAlone(k*e.tpb, f*e.tpb)
		t := max(run, max(flight[k], e.link.arrival(host, disk, e.t))-e.t) + e.t + float64(max(others, 0))*run
		if t < bestT {
			best, bestT = k, t
		}
	}
	return f, best
}

// cheapestReuse returns how many of the first reused cached blocks of j's
// chain to reuse if it is admitted now: the cut c that minimizes the time to
// its first token plus the delay its extra computing imposes on the others
// still waiting for theirs. For each cut, its own time is when its cold
// blocks before c would arrive (the link as it is booked now; blocks
// prefetch has in flight when they land) plus the time to prefill the rest
// of the prompt alone, chunked by the token budget; the delay is the
// prefill time beyond that of reusing all of it, once for every other
// request that is waiting or not yet at its first token (they share the
// steps). Ties keep the longer reuse. Host blocks are almost always worth
// reading; disk blocks only when the engine is idle enough and reading is
// slower than recomputing (the defaults: 64 µs a token against 50).
//
// A recomputed block replaces its cold copy when the request commits it
// (the manager adopts a cache's page in place of an unreferenced colder
// one), so later requests find it on the GPU.
func (e *engine) cheapestReuse(j *job, reused int) int {
	others := e.sch.Len() - 1
	for _, r := range e.running {
		if r.phase == onboarding || r.phase == prefilling {
			others++
		}
	}
	base := e.prefillAlone(j.p-reused*e.tpb, reused*e.tpb)
	best, bestT := reused, math.Inf(1)
	host, disk, inFlight := 0, 0, e.t
	for c := 0; c <= reused; c++ {
		if c > 0 {
			k := j.chain[c-1]
			switch e.cached[k] {
			case 0:
				if r, ok := e.readyAt[k]; ok {
					inFlight = max(inFlight, r)
				}
			case 1:
				host++
			case 2:
				disk++
			}
		}
		compute := e.prefillAlone(j.p-c*e.tpb, c*e.tpb)
		t := max(inFlight, e.link.arrival(host, disk, e.t)) + compute + float64(max(others, 0))*(compute-base)
		if t <= bestT {
			best, bestT = c, t
		}
	}
	return best
}

// prefillAlone is the cost model's time to prefill u tokens after p cached
// ones in chunks of the token budget, with nothing else in the steps.
func (e *engine) prefillAlone(u, p int) float64 {
	var t float64
	for u > 0 {
		n := min(u, e.opts.TokenBudget)
		var sc stepCost
		sc.prefill(n, p)
		t += e.opts.Cost.step(&sc)
		u, p = u-n, p+n
	}
	return t
}

func (e *engine) finish(j *job) {
	if err := j.cache.Close(); err != nil {
		e.fail(err)
		return
	}
	e.charge()
	for _, k := range j.pins {
		if e.pins[k]--; e.pins[k] == 0 {
			delete(e.pins, k)
		}
	}
	e.outstanding -= j.totalBlocks - j.capBlocks
	if e.reuse != nil {
		e.setPriorities(e.reuse.Released(j.cache.Keys())) // the committed chain's
	}
	j.phase = finished
	e.res.Requests = append(e.res.Requests, RequestResult{
		ID: j.req.ID, Arrival: j.arrival, Admit: j.admitT, Ready: j.readyT, FirstToken: j.firstT, Finish: e.t,
		Prompt: j.p, Reused: j.reused, ReusedByLevel: [3]int{j.byLevel[0] * e.tpb, j.byLevel[1] * e.tpb, j.byLevel[2] * e.tpb},
		Bypassed: j.bypass,
	})
	j.prompt, j.full, j.chain, j.pins, j.cache = nil, nil, nil, nil, nil
	if nt := e.nextTurn[j.idx]; nt >= 0 {
		heap.Push(&e.followups, arrival{t: e.t + e.tr.Requests[nt].Think, idx: nt})
	}
	e.done++
}

func (e *engine) result() *Result {
	r := e.res
	sort.SliceStable(r.Requests, func(a, b int) bool { return r.Requests[a].Arrival < r.Requests[b].Arrival })
	r.Skip = int(math.Floor(e.opts.Warmup * float64(len(r.Requests))))
	r.SimTime = e.t
	r.Evictions = e.m.Stats().Evictions
	r.Moved, r.BlockBytes = e.link.moved, e.link.blockBytes
	r.Sched = e.sch.Stats()
	return &r
}

type arrival struct {
	t   float64
	idx int
}

type arrivals []arrival

func (h arrivals) Len() int { return len(h) }
func (h arrivals) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].idx < h[j].idx
}
func (h arrivals) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *arrivals) Push(x any)   { *h = append(*h, x.(arrival)) }
func (h *arrivals) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
