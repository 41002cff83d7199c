package core_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
	"github.com/kvcm/kvcm/internal/testkit/disktest"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// sessionLimit is how long one session may run before it counts as a
// deadlock; sessions are tiny, so this is generous.
const sessionLimit = 2 * time.Minute

// FuzzSessions decodes its input into a bounded session against a manager
// with tiny tiers, faulty codecs, a delaying and failing emulated device and
// a faulty disk, and drives it with the fake engine. Errors are fine; panics,
// invariant violations (CheckInvariants after every call), a call that fails
// but changes the cache, wrong KV bytes without an error, a leak at the end
// and deadlocks are failures. With KVCM_FUZZ_TRACE set, every session logs
// its configuration and calls.
func FuzzSessions(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog := time.AfterFunc(sessionLimit, func() {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			panic(fmt.Sprintf("session ran past %v: deadlock?\n%s", sessionLimit, buf[:n]))
		})
		defer watchdog.Stop()
		s := newSession(t, data)
		if os.Getenv("KVCM_FUZZ_TRACE") != "" {
			defer func() { t.Logf("config: %+v\ncalls:\n  %s", s.cfg, joinLines(s.ops)) }()
		}
		s.run()
	})
}

// FuzzBeamSessions is FuzzSessions with beam search steps among the calls:
// beam width changes and commits that reorder the beams (beam 0 always keeps
// its own history, the one the harness writes and verifies), so the page
// bookkeeping of forked, reordered and unified beams is checked after every
// call, under the same faults, eviction and cold tiers.
func FuzzBeamSessions(f *testing.F) {
	// Every byte is drawn from the op codes that build up beams (create,
	// resume, advance, commit, suspend, verify, beam steps), so whatever
	// position a byte is read at, the session reaches beam search states.
	codes := []byte{0, 2, 3, 3, 3, 5, 6, 12, 14, 14, 14, 14 + 15, 14 + 30}
	rng := rand.New(rand.NewPCG(13, 13))
	for range 12 {
		seed := make([]byte, 4*maxOps)
		for i := range seed {
			seed[i] = codes[rng.IntN(len(codes))]
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newSession(t, data)
		s.beams = true
		if os.Getenv("KVCM_FUZZ_TRACE") != "" {
			defer func() { t.Logf("config: %+v\ncalls:\n  %s", s.cfg, joinLines(s.ops)) }()
		}
		s.run()
	})
}

// FuzzSsmSessions is FuzzSessions over a hybrid model: SSM layers beside
// the attention ones (commit_min_snapshot, maybe a cap on SSM slots), so
// every call also checks the SSM states, the snapshots commits take and the
// reuse that resumes from them: the engine writes each cache's state and
// verifies it whenever it verifies up to the history length, so a snapshot
// of another length or another prefix is a mismatch.
func FuzzSsmSessions(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add(seed)
	}
	// Seeds drawn from the op codes that compute, commit and reuse.
	codes := []byte{0, 1, 2, 3, 3, 4, 5, 5, 6, 8, 12, 13}
	rng := rand.New(rand.NewPCG(17, 17))
	for range 12 {
		seed := make([]byte, 4*maxOps)
		for i := range seed {
			seed[i] = codes[rng.IntN(len(codes))]
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog := time.AfterFunc(sessionLimit, func() {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			panic(fmt.Sprintf("session ran past %v: deadlock?\n%s", sessionLimit, buf[:n]))
		})
		defer watchdog.Stop()
		s := newSession(t, data)
		s.addSsm()
		if os.Getenv("KVCM_FUZZ_TRACE") != "" {
			defer func() { t.Logf("config: %+v\ncalls:\n  %s", s.cfg, joinLines(s.ops)) }()
		}
		s.run()
	})
}

// fuzzSeeds seed the corpus alongside testdata/fuzz/FuzzSessions.
var fuzzSeeds = [][]byte{
	{},
	{0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
}

// input reads the fuzz bytes; past the end it reads zeros.
type input struct {
	b []byte
	i int
}

func (in *input) byte() int {
	if in.i >= len(in.b) {
		in.i++
		return 0
	}
	in.i++
	return int(in.b[in.i-1])
}

func (in *input) n(k int) int { return in.byte() % k }

func (in *input) more() bool { return in.i < len(in.b) }

const (
	maxOps      = 80
	numPrefixes = 3
)

type session struct {
	t      *testing.T
	in     *input
	cfg    config.Config
	dev    *emu.Device
	files  *disktest.Files
	faulty *codectest.Faulty
	m      *core.Manager
	eng    *fakeengine.Engine
	quotas []int64 // bytes of one slot's worth of every pool group, per level

	prefixes [numPrefixes][]config.Token
	caches   []*hcache
	closed   []*core.KVCache
	ops      []string
	// beams adds beam search steps to the calls (FuzzBeamSessions).
	beams bool
}

// hcache is the harness's view of one cache.
type hcache struct {
	c                  *core.KVCache
	stream             device.Stream
	seq                []config.Token // the whole request: prompt and generated tokens
	history, committed int
	ended              bool
	// tainted: an engine write into the cache failed; like a real
	// engine, the harness only closes the cache then.
	tainted bool
}

func newSession(t *testing.T, data []byte) *session {
	in := &input{b: data}
	s := &session{t: t, in: in}
	tpb := []int{2, 4}[in.n(2)]
	layer := func(id int32, tokBytes int64, window, sinks int) config.AttentionLayerConfig {
		return config.AttentionLayerConfig{LayerID: id, SlidingWindowSize: window, NumSinkTokens: sinks,
			Buffers: []config.BufferConfig{
				{Role: config.RoleKey, Size: tokBytes * int64(tpb)}, {Role: config.RoleValue, Size: tokBytes * int64(tpb)},
			}}
	}
	groups := 1 + in.n(3)
	layers := []config.AttentionLayerConfig{layer(0, 8, 0, 0), layer(1, 8, 0, 0)}
	var blockBytes int64 = 4 * 8 * int64(tpb)
	if groups >= 2 { // a sliding window, maybe with sinks
		window := tpb * (1 + in.n(3))
		sinks := []int{0, 1, tpb}[in.n(3)]
		layers = append(layers, layer(2, 16, window, sinks))
		blockBytes += 2 * 16 * int64(tpb)
	}
	if groups >= 3 { // another window, pages of another size
		layers = append(layers, layer(3, 4, tpb*(2+in.n(2)), 0))
		blockBytes += 2 * 4 * int64(tpb)
	}
	gpuBlocks := int64(3 + in.n(8))
	gpu := config.GPU(gpuBlocks * blockBytes)
	if in.n(2) == 1 {
		gpu.MaxQuota = 2 * gpu.Quota
	}
	s.cfg = config.Config{TokensPerBlock: tpb, Layers: layers, CacheTiers: []config.CacheTierConfig{gpu},
		EnablePartialReuse: in.n(2) == 1, EnableStats: in.n(2) == 1}
	s.quotas = []int64{blockBytes}
	tiers := in.n(4) // bit 0: host, bit 1: disk
	if tiers&1 != 0 {
		s.cfg.CacheTiers = append(s.cfg.CacheTiers, config.Host(int64(1+in.n(8))*blockBytes))
		s.quotas = append(s.quotas, blockBytes)
	}
	if tiers&2 != 0 {
		s.cfg.CacheTiers = append(s.cfg.CacheTiers, config.Disk(int64(1+in.n(8))*blockBytes, t.TempDir()))
		s.quotas = append(s.quotas, blockBytes)
	}
	seed := uint64(in.byte())
	// The seed's top bits also pick max_util_for_resume (0: the default).
	s.cfg.MaxUtilForResume = []float64{0, 0.9, 0.6, 0.3}[seed>>6]
	s.dev = emu.New(emu.Options{
		Seed:     int64(seed),
		MaxDelay: []time.Duration{0, 0, 20 * time.Microsecond, 200 * time.Microsecond}[in.n(4)],
		FailRate: []float64{0, 0, 0, 0.002, 0.02}[in.n(5)],
	})
	s.files = disktest.New(disktest.Options{Seed: seed, Rate: []float64{0, 0, 0.01, 0.1}[in.n(4)]})
	for k := range s.prefixes {
		n := tpb * (1 + in.n(4))
		for i := range n {
			s.prefixes[k] = append(s.prefixes[k], config.Token(100*k+i))
		}
	}
	return s
}

// addSsm makes the session's model a hybrid one: one or two SSM layers
// after the attention layers (states of a few sizes), commit_min_snapshot,
// and maybe max_ssm_slots. Every level grows by room for a few states, so
// the attention layers keep the blocks the session drew.
func (s *session) addSsm() {
	in := s.in
	var stateBytes int64
	for k := range 1 + in.n(2) {
		st := int64(16 * (1 + in.n(4)))
		conv := int64(8 * (1 + in.n(2)))
		s.cfg.SsmLayers = append(s.cfg.SsmLayers, config.SsmLayerConfig{LayerID: int32(len(s.cfg.Layers) + k),
			Buffers: []config.BufferConfig{{Role: "ssm_state", Size: st}, {Role: "conv_state", Size: conv}}})
		stateBytes += st + conv
	}
	s.cfg.CommitMinSnapshot = true
	s.cfg.MaxSsmSlots = []int64{0, 0, 2, 4}[in.n(4)]
	states := int64(2 + in.n(6))
	for i := range s.cfg.CacheTiers {
		s.cfg.CacheTiers[i].Quota += states * stateBytes
		if s.cfg.CacheTiers[i].MaxQuota != 0 {
			s.cfg.CacheTiers[i].MaxQuota += 2 * states * stateBytes
		}
		s.quotas[i] += stateBytes
	}
}

func (s *session) logf(format string, args ...any) {
	s.ops = append(s.ops, fmt.Sprintf(format, args...))
}

// failf reports a failure with the session's call log.
func (s *session) failf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("%s\nconfig: %+v\nfaults: %s\ncalls:\n  %s", fmt.Sprintf(format, args...), s.cfg, s.faults(), joinLines(s.ops))
}

// faults summarizes the disk faults injected so far.
func (s *session) faults() string {
	out := fmt.Sprintf("%d silent disk reads", s.files.SilentReads())
	for _, f := range disktest.Faults() {
		if n := s.files.Injected(f); n > 0 {
			out += fmt.Sprintf(", %d %v", n, f)
		}
	}
	return out
}

func joinLines(lines []string) string {
	out := ""
	for i, l := range lines {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}

// newCodec picks the codec: the default, a faulty wrapper, or one that
// reports garbage (NewManager must reject it).
func (s *session) newCodec() (own *codec.Owned, garbage bool) {
	switch s.in.n(4) {
	case 0:
		return nil, false
	case 3:
		s.faulty = codectest.NewFaulty(codec.NewDefault())
		lc := layout.LayerGroupID(s.in.n(len(s.lifecycles())))
		switch s.in.n(4) {
		case 0:
			s.faulty.SetColdPageBytes(lc, []int64{0, -1, math.MinInt64, -4096}[s.in.n(4)])
		case 1:
			s.faulty.SetBatchingID(lc, layout.LayerGroupID([]int{-1, 7, 1 << 20}[s.in.n(3)]))
		case 2:
			s.faulty.SetLocation(lc, codec.PageIndexLocation([]int{-1, 2, 99}[s.in.n(3)]))
		case 3:
			s.faulty.RejectConfigure(true)
		}
		return codec.Own(s.faulty), true
	}
	s.faulty = codectest.NewFaulty(codec.NewDefault())
	return codec.Own(s.faulty), false
}

func (s *session) lifecycles() []int {
	seen := map[[2]int]bool{}
	var out []int
	for _, l := range s.cfg.Layers {
		k := [2]int{l.SlidingWindowSize, l.NumSinkTokens}
		if !seen[k] {
			seen[k] = true
			out = append(out, len(out))
		}
	}
	if len(s.cfg.SsmLayers) > 0 {
		out = append(out, len(out))
	}
	return out
}

func (s *session) run() {
	t := s.t
	own, garbage := s.newCodec()
	m, err := core.NewManager(s.cfg, core.WithDevice(s.dev), core.WithColdPageCodec(own), core.WithDiskFiles(s.files.Open))
	defer s.dev.Close()
	if err != nil {
		s.checkFreed("a failed NewManager")
		return
	}
	if garbage {
		m.Close()
		s.failf("NewManager accepted a codec reporting garbage")
	}
	s.m = m
	s.eng, err = fakeengine.New(m, s.cfg, fakeengine.Options{Seed: 7})
	if err != nil {
		t.Fatalf("fakeengine: %v", err)
	}
	for op := 0; op < maxOps && s.in.more(); op++ {
		s.step()
		s.check()
	}
	s.finish()
}

// check runs the invariant checker and compares the harness's view of every
// cache with the manager's.
func (s *session) check() {
	s.t.Helper()
	err := s.m.CheckInvariants(s.closed...)
	if err != nil {
		s.failf("invariants broken after %s:\n%v", s.ops[len(s.ops)-1], err)
	}
	for _, h := range s.caches {
		if got := h.c.HistoryLength(); got != h.history {
			s.failf("cache %d: history %d, harness expects %d", h.c.ID(), got, h.history)
		}
		if got := h.c.NumCommittedTokens(); got != h.committed {
			s.failf("cache %d: %d committed tokens, harness expects %d", h.c.ID(), got, h.committed)
		}
	}
}

// call runs one manager call, turning a panic into a failure: the manager
// guards its codec, so not even an injected codec panic may escape.
func (s *session) call(what string, fn func() error) (err error) {
	s.t.Helper()
	defer func() {
		r := recover()
		if r == nil {
			s.logf("%s: %v", what, err)
			return
		}
		buf := make([]byte, 1<<16)
		n := runtime.Stack(buf, false)
		s.logf("%s: PANIC %v", what, r)
		s.failf("panic in %s: %v\n%s", what, r, buf[:n])
	}()
	return fn()
}

// pick returns the cache an operation works on. A tainted cache is closed
// instead, as an engine aborts a request whose stream failed: its pages may
// hold anything.
func (s *session) pick(which int) *hcache {
	if len(s.caches) == 0 {
		return nil
	}
	h := s.caches[which%len(s.caches)]
	if h.tainted {
		s.close(h)
		return nil
	}
	return h
}

func (s *session) step() {
	op, a, b, which := s.in.byte(), s.in.byte(), s.in.byte(), s.in.byte()
	ops := 14
	if s.beams {
		ops++
	}
	switch op % ops {
	case 0, 1:
		s.create(a, b, which)
	case 2:
		if h := s.pick(which); h != nil {
			s.resume(h)
		}
	case 3, 4:
		if h := s.pick(which); h != nil {
			s.advance(h, 1+a%(4*s.cfg.TokensPerBlock), op%ops == 4 && len(s.cfg.SsmLayers) > 0)
		}
	case 5:
		if h := s.pick(which); h != nil {
			s.commit(h, a, b%4 == 0)
		}
	case 6:
		if h := s.pick(which); h != nil {
			s.call(fmt.Sprintf("suspend %d", h.c.ID()), h.c.Suspend)
		}
	case 7:
		if h := s.pick(which); h != nil {
			lvl := layout.CacheLevel(a % len(s.cfg.CacheTiers))
			s.call(fmt.Sprintf("prefetch %d to %d", h.c.ID(), lvl), func() error { return h.c.Prefetch(lvl) })
		}
	case 8:
		if h := s.pick(which); h != nil {
			s.close(h)
		}
	case 9:
		k := s.prefixes[a%numPrefixes]
		in := append(append([]config.Token(nil), k...), config.Token(b))
		var n int
		s.call("probe", func() error { n = s.m.ProbeReuse(blockhash.Scope{}, in); return nil })
		if n < 0 || n > len(in)-1 {
			s.failf("ProbeReuse of %d tokens returned %d", len(in), n)
		}
	case 10:
		lvl := a % len(s.cfg.CacheTiers)
		q := int64(1+b%10) * s.quotas[lvl]
		s.call(fmt.Sprintf("resize level %d to %d", lvl, q), func() error { return s.m.ResizeLevel(layout.CacheLevel(lvl), q) })
	case 11:
		s.arm(a, b)
	case 12:
		if h := s.pick(which); h != nil && h.c.Status() == core.Active {
			s.verify(h, "verify")
		}
	case 13:
		if h := s.pick(which); h != nil {
			s.call(fmt.Sprintf("stop committing %d", h.c.ID()), func() error { h.c.StopCommitting(); h.ended = true; return nil })
		}
	case 14:
		if h := s.pick(which); h != nil {
			s.beam(h, a, b)
		}
	}
}

// beam runs a beam search step: a new beam width, or a commit whose
// beam_search_indices reorder the beams other than beam 0. A failed call
// must change neither the width nor the committed tokens.
func (s *session) beam(h *hcache, a, b int) {
	width := h.c.BeamWidth()
	if a%2 == 0 {
		w := 1 + b%3
		err := s.call(fmt.Sprintf("beam width %d: %d to %d", h.c.ID(), width, w), func() error { return h.c.SetBeamWidth(w) })
		if got := h.c.BeamWidth(); err == nil && got != w || err != nil && got != width {
			s.failf("cache %d: beam width %d after SetBeamWidth(%d) from %d: %v", h.c.ID(), got, w, width, err)
		}
		return
	}
	parents := make([]int, width)
	for j := 1; j < width; j++ {
		parents[j] = (b >> j) % width
	}
	n := min(a%(2*s.cfg.TokensPerBlock+1), h.history-h.committed)
	err := s.call(fmt.Sprintf("commit %d: %d tokens at %d, beams %v", h.c.ID(), n, h.committed, parents), func() error {
		return h.c.CommitBeamSearch(h.seq[h.committed:h.committed+n], parents, false)
	})
	if err == nil {
		if h.ended {
			s.failf("cache %d: commit after stop_committing/is_end succeeded", h.c.ID())
		}
		h.committed += n
	}
	if got := h.c.BeamWidth(); got != width {
		s.failf("cache %d: beam width %d after a commit at width %d", h.c.ID(), got, width)
	}
}

// arm injects one fault into the codec, the device or the disk.
func (s *session) arm(a, b int) {
	op := codectest.Op(b % 2)
	switch a % 6 {
	case 0:
		if s.faulty != nil {
			s.faulty.FailSync(op, b%3, 1+b%2)
			s.logf("arm codec sync %v failure", op)
		}
	case 1:
		if s.faulty != nil {
			s.faulty.FailAsync(op, b%3, 1+b%2, nil)
			s.logf("arm codec async %v failure", op)
		}
	case 2:
		if s.faulty != nil {
			s.faulty.FailPanic(op, b%3, 1)
			s.logf("arm codec %v panic", op)
		}
	case 3:
		s.dev.FailNext(1 + b%3)
		s.logf("arm device: next %d copies fail", 1+b%3)
	case 4:
		ft := disktest.Faults()[b%len(disktest.Faults())]
		s.files.FailNext(ft)
		s.logf("arm disk %v", ft)
	case 5:
		if s.faulty != nil {
			s.faulty.Heal()
		}
		s.dev.FailNext(0)
		s.logf("heal")
	}
}

// create makes a cache for a request of one or two shared prefixes, a
// private suffix and generated tokens (a, b); which picks a priority
// callback: none, one clamping out-of-range values, or one panicking.
func (s *session) create(a, b, which int) {
	tpb := s.cfg.TokensPerBlock
	seq := append([]config.Token(nil), s.prefixes[a%numPrefixes]...)
	if a/numPrefixes%2 == 1 { // two shared prefixes in a row
		seq = append(seq, s.prefixes[(a+1)%numPrefixes]...)
	}
	for i := range b % (3 * tpb) {
		seq = append(seq, config.Token(1000+b*16+i))
	}
	for i := range 1 + b%(2*tpb) { // generated tokens
		seq = append(seq, config.Token(5000+b*16+i))
	}
	prompt := max(len(seq)-(1+b%(2*tpb)), 1)
	scope := blockhash.Scope{}
	if b&0x80 != 0 {
		scope = blockhash.Scope{Salt: "other"}
	}
	probe := s.m.ProbeReuse(scope, seq[:prompt])
	var c *core.KVCache
	err := s.call(fmt.Sprintf("create prompt %d of %d tokens", prompt, len(seq)), func() (err error) {
		c, err = s.m.CreateKVCache(core.CacheOptions{Scope: scope, InputTokens: seq[:prompt], Priority: priority(which)})
		return err
	})
	if err != nil {
		return
	}
	st, err := s.dev.NewStream()
	if err != nil {
		s.failf("new stream: %v", err)
	}
	r := c.ReusedTokens()
	if r < 0 || r > prompt || r > probe { // a prompt cached whole is reused whole
		s.failf("cache %d reused %d tokens of a %d-token prompt; ProbeReuse said %d", c.ID(), r, prompt, probe)
	}
	s.caches = append(s.caches, &hcache{c: c, stream: st, seq: seq, history: r, committed: r})
	s.logf("  cache %d reused %d", c.ID(), r)
}

// priority returns the priority callback which selects: nil, one returning
// values in and out of [MinPriority, MaxPriority], or one that panics for
// one block.
func priority(which int) core.PriorityFunc {
	switch which % 4 {
	case 1, 2:
		return func(b int, lc layout.LayerGroupID) int { return (b*37+which+int(lc)*11)%150 - 20 }
	case 3:
		return func(b int, _ layout.LayerGroupID) int {
			if b == which/4%4 {
				panic("fuzz: priority callback panics")
			}
			return core.DefaultPriority + b
		}
	}
	return nil
}

func (s *session) resume(h *hcache) {
	err := s.call(fmt.Sprintf("resume %d", h.c.ID()), func() error { return h.c.Resume(h.stream) })
	if err == nil {
		s.verify(h, "verify after resume")
	}
}

// verify reads back every position the cache holds and demands the fake
// model's bytes unless the read itself failed. Silent disk damage
// (truncation, overwrite, flipped bits) is no excuse: the blob checksums turn
// it into lost pages.
func (s *session) verify(h *hcache, what string) {
	res, err := s.eng.Verify(h.c, h.seq, 0, h.history)
	s.logf("%s %d: %d pages, %d mismatches, %v", what, h.c.ID(), res.PagesVerified, res.Mismatches, err)
	if err != nil {
		return // the engine carries on: what it wrote is intact, and lost pages are the manager's to report
	}
	if res.Mismatches > 0 {
		s.failf("cache %d: wrong KV bytes without an error (%d lost pages): %v", h.c.ID(), h.c.LostPages(), res.First)
	}
}

// advance computes n more positions the way an engine step does: resize for
// them, write their KV, advance the history. With commit (SSM sessions), a
// cache whose history is all committed commits the computed tokens instead,
// a commit from the history length that advances it.
func (s *session) advance(h *hcache, n int, commit bool) {
	if h.c.Status() != core.Active {
		s.call(fmt.Sprintf("resize %d while %v", h.c.ID(), h.c.Status()), func() error { return h.c.Resize(h.history+n, -1) })
		return
	}
	to := min(h.history+n, len(h.seq))
	if to == h.history {
		return
	}
	if s.call(fmt.Sprintf("resize %d to %d at %d", h.c.ID(), to, h.history), func() error { return h.c.Resize(to, h.history) }) != nil {
		return
	}
	if err := s.eng.Step(h.c, h.seq, h.history, to); err != nil {
		s.logf("  step %d [%d, %d): %v", h.c.ID(), h.history, to, err)
		h.tainted = true
		return
	}
	if commit && !h.ended && h.committed == h.history {
		err := s.call(fmt.Sprintf("commit %d: %d computed tokens at %d", h.c.ID(), to-h.committed, h.committed), func() error {
			return h.c.Commit(h.seq[h.committed:to], false)
		})
		if err == nil {
			h.committed, h.history = to, to
			return
		}
	}
	if s.call(fmt.Sprintf("resize %d history to %d", h.c.ID(), to), func() error { return h.c.Resize(to, to) }) == nil {
		h.history = to
	}
}

func (s *session) commit(h *hcache, a int, isEnd bool) {
	n := min(a%(4*s.cfg.TokensPerBlock+1), h.history-h.committed)
	err := s.call(fmt.Sprintf("commit %d: %d tokens at %d, end %v", h.c.ID(), n, h.committed, isEnd), func() error {
		return h.c.Commit(h.seq[h.committed:h.committed+n], isEnd)
	})
	if err == nil {
		if h.ended {
			s.failf("cache %d: commit after stop_committing/is_end succeeded", h.c.ID())
		}
		h.committed += n
		h.ended = h.ended || isEnd
	}
}

func (s *session) close(h *hcache) {
	if s.call(fmt.Sprintf("close %d", h.c.ID()), h.c.Close) != nil {
		return
	}
	h.stream.Synchronize() // the engine's own failures are its business
	h.stream.Close()
	for i, x := range s.caches {
		if x == h {
			s.caches = append(s.caches[:i], s.caches[i+1:]...)
			break
		}
	}
	s.closed = append(s.closed, h.c)
}

// finish closes every cache, the engine and the manager, and demands that
// nothing leaked: every device allocation and disk file is released.
func (s *session) finish() {
	for len(s.caches) > 0 {
		h := s.caches[0]
		s.close(h)
		if len(s.caches) > 0 && s.caches[0] == h {
			s.failf("cache %d cannot be closed", h.c.ID())
		}
		s.check()
	}
	if err := s.m.CheckInvariants(s.closed...); err != nil {
		s.failf("invariants broken after closing every cache:\n%v", err)
	}
	if err := s.eng.Close(); err != nil {
		s.failf("close the engine: %v", err)
	}
	err := s.m.Close() // may report an asynchronous failure of the last work
	s.logf("close manager: %v", err)
	if _, cerr := s.m.CreateKVCache(core.CacheOptions{}); !errors.Is(cerr, core.ErrClosed) {
		s.failf("the manager is not closed after Close: %v", err)
	}
	s.checkFreed("Close")
}

// checkFreed demands that no device memory and no disk file is left.
func (s *session) checkFreed(after string) {
	if n := s.dev.Stats().LiveAllocs.Total(); n != 0 {
		s.failf("%d device allocations left after %s", n, after)
	}
	if n := s.files.OpenFiles(); n != 0 {
		s.failf("%d disk files left open after %s", n, after)
	}
	if s.faulty != nil && s.faulty.Closes() != 1 {
		s.failf("the codec was closed %d times after %s", s.faulty.Closes(), after)
	}
}
