// Package fakeengine is a fake inference engine for tests and demos of the
// manager: it writes deterministic KV bytes into the pages a KVCache gives it
// and checks them, byte for byte, whenever pages are read back or reused.
//
// The KV of position p of a sequence, for one (layer, role) buffer, is a
// pseudo-random byte stream seeded by a chained hash of tokens[0..p], by p and
// by the buffer, so it depends on the whole prefix like real attention KV: a
// reused page verifies only if it really holds the KV of the same prefix.
//
// The engine reaches pages only through the device, as a real engine's
// kernels would: it fills a host-mapped scratch buffer and enqueues one
// BatchCopy into the cache's pages on the cache's stream (reads go the other
// way), then synchronizes the stream so the scratch can be reused. Page
// addresses come from KVCache.BasePageIndicesOfBeam (beam 0 for Step and
// Verify, any beam for StepBeam and VerifyBeam, each with that beam's
// hypothesis tokens) and Manager.Buffer: block b of a
// buffer lives at PoolBase + (base*Scale+Offset)*Bytes, and token t of the
// block Bytes/TokensPerBlock bytes further per token.
//
// SSM layers hold one state per cache instead of KV per position: after
// computing n positions, the state of an SSM buffer is a pseudo-random byte
// stream seeded by the prefix hash of tokens[0..n-1], by n and by the buffer.
// Step writes the state after its last position into the cache's state page
// (KVCache.SsmBlockBaseIndex); Verify checks it after the range's end when
// that end is the cache's history length, so a reused snapshot verifies only
// if it holds the state of the same prefix at the same length.
//
// Step and Verify work on caches the caller drives; Session and Serve drive a
// whole request the way an engine's scheduler would.
package fakeengine

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// Options configure an Engine. The zero value is usable.
type Options struct {
	// Seed selects the fake model: engines with different seeds produce
	// different KV bytes (and different generated tokens) for equal tokens.
	Seed uint64
	// ZeroLowBytes makes the low byte of every 16-bit little-endian element
	// (the byte at each even offset of a buffer) zero, so a codec that keeps
	// only high bytes (codectest.Half) is lossless on the data. Every
	// buffer's per-token bytes must then be even.
	ZeroLowBytes bool
	// NoData skips every data write and check: Step, Verify and Corrupt do
	// nothing, so a Session measures only the manager's bookkeeping.
	NoData bool
	// ChunkTokens is the prefill chunk of a Session: how many prompt tokens
	// one Advance computes. Zero means 256.
	ChunkTokens int
	// Vocab is the size of the generated tokens' vocabulary. Zero means
	// 32000.
	Vocab int
	// ScratchBytes caps one scratch buffer; a Step or Verify moving more
	// bytes runs in several rounds. Zero means 4 MiB. It is raised to the
	// largest buffer's bytes per block if smaller.
	ScratchBytes int64
}

const (
	defaultChunkTokens  = 256
	defaultVocab        = 32000
	defaultScratchBytes = 4 << 20
)

// Mismatch describes one position of one buffer whose bytes differ from the
// fake model's.
type Mismatch struct {
	CacheID  uint64
	Block    int
	Layer    int32
	Role     config.DataRole
	Position int
	// Offset is the first differing byte within the position's bytes.
	Offset    int
	Got, Want byte
}

func (m Mismatch) String() string {
	return fmt.Sprintf("cache %d block %d layer %d role %q position %d byte %d: got %#02x, want %#02x",
		m.CacheID, m.Block, m.Layer, m.Role, m.Position, m.Offset, m.Got, m.Want)
}

// Stats are an engine's cumulative counters.
type Stats struct {
	// PagesVerified counts (block, layer group) pages of which Verify read
	// back and checked at least one position.
	PagesVerified int64
	// PagesSkipped counts (block, layer group) pages Verify skipped because
	// the cache holds no page there (released by a sliding window).
	PagesSkipped int64
	// Mismatches counts (position, layer, role) triples whose bytes differ.
	Mismatches int64
	// BytesWritten and BytesVerified count KV bytes written by Step and
	// checked by Verify.
	BytesWritten  int64
	BytesVerified int64
	// FirstMismatch is the first mismatch found, nil while there is none.
	FirstMismatch *Mismatch
}

// VerifyResult is the outcome of one Verify call.
type VerifyResult struct {
	PagesVerified int64
	PagesSkipped  int64
	Mismatches    int64
	// First is the call's first mismatch, nil if none.
	First *Mismatch
}

// buffer is one (layer, role) buffer of the configuration.
type buffer struct {
	layer    int32
	role     config.DataRole
	lg       layout.LayerGroupID
	tokBytes int64
	salt     uint64
}

// Engine is the fake engine. It is safe for concurrent use; calls on
// different caches run in parallel.
type Engine struct {
	m    *core.Manager
	dev  device.Device
	tpb  int
	opts Options
	bufs []buffer
	byLG [][]int // buffer indices per layer group
	// ssm are the SSM layers' state buffers (tokBytes is a state's bytes),
	// ssmLG their layer group.
	ssm     []buffer
	ssmLG   layout.LayerGroupID
	scratch int64 // bytes of one scratch buffer

	mu     sync.Mutex
	free   []device.Memory // idle scratch buffers
	all    []device.Memory
	closed bool
	first  *Mismatch

	pagesVerified, pagesSkipped, mismatches atomic.Int64
	bytesWritten, bytesVerified             atomic.Int64
}

// ErrClosed is returned by an Engine's methods after Close.
var ErrClosed = errors.New("fakeengine: engine closed")

// New returns an engine writing into m's pages; cfg must be the manager's
// configuration. Every buffer's Size must divide by TokensPerBlock.
func New(m *core.Manager, cfg config.Config, opts Options) (*Engine, error) {
	if m == nil {
		return nil, errors.New("fakeengine: nil manager")
	}
	if cfg.TokensPerBlock != m.TokensPerBlock() {
		return nil, fmt.Errorf("fakeengine: config has %d tokens per block, the manager %d", cfg.TokensPerBlock, m.TokensPerBlock())
	}
	if opts.ChunkTokens < 0 || opts.Vocab < 0 || opts.ScratchBytes < 0 {
		return nil, fmt.Errorf("fakeengine: negative option in %+v", opts)
	}
	if opts.ChunkTokens == 0 {
		opts.ChunkTokens = defaultChunkTokens
	}
	if opts.Vocab == 0 {
		opts.Vocab = defaultVocab
	}
	if opts.ScratchBytes == 0 {
		opts.ScratchBytes = defaultScratchBytes
	}
	e := &Engine{m: m, dev: m.Device(), tpb: cfg.TokensPerBlock, opts: opts, scratch: opts.ScratchBytes,
		byLG: make([][]int, m.NumLayerGroups())}
	layers := slices.Clone(cfg.Layers)
	slices.SortFunc(layers, func(a, b config.AttentionLayerConfig) int { return int(a.LayerID) - int(b.LayerID) })
	for i, l := range layers {
		lg, err := m.LayerGroupOf(l.LayerID)
		if err != nil {
			return nil, fmt.Errorf("fakeengine: layers[%d]: %w", i, err)
		}
		for j, b := range l.Buffers {
			if b.Size%int64(e.tpb) != 0 {
				return nil, fmt.Errorf("fakeengine: layer %d buffer %d (%q): size %d is not a multiple of %d tokens per block",
					l.LayerID, j, b.Role, b.Size, e.tpb)
			}
			tok := b.Size / int64(e.tpb)
			if opts.ZeroLowBytes && tok%2 != 0 {
				return nil, fmt.Errorf("fakeengine: layer %d buffer %q: ZeroLowBytes needs even bytes per token, got %d",
					l.LayerID, b.Role, tok)
			}
			loc, err := m.Buffer(l.LayerID, b.Role)
			if err != nil {
				return nil, fmt.Errorf("fakeengine: layer %d buffer %q: %w", l.LayerID, b.Role, err)
			}
			if loc.Bytes != b.Size || loc.LifeCycle != lg {
				return nil, fmt.Errorf("fakeengine: layer %d buffer %q: config does not match the manager's layout", l.LayerID, b.Role)
			}
			e.byLG[lg] = append(e.byLG[lg], len(e.bufs))
			e.bufs = append(e.bufs, buffer{layer: l.LayerID, role: b.Role, lg: lg, tokBytes: tok,
				salt: bufferSalt(l.LayerID, b.Role)})
			e.scratch = max(e.scratch, b.Size)
		}
	}
	for i, l := range cfg.SsmLayers {
		lg, err := m.LayerGroupOf(l.LayerID)
		if err != nil {
			return nil, fmt.Errorf("fakeengine: ssm_layers[%d]: %w", i, err)
		}
		e.ssmLG = lg
		for _, b := range l.Buffers {
			if opts.ZeroLowBytes && b.Size%2 != 0 {
				return nil, fmt.Errorf("fakeengine: SSM layer %d buffer %q: ZeroLowBytes needs an even size, got %d",
					l.LayerID, b.Role, b.Size)
			}
			loc, err := m.Buffer(l.LayerID, b.Role)
			if err != nil {
				return nil, fmt.Errorf("fakeengine: SSM layer %d buffer %q: %w", l.LayerID, b.Role, err)
			}
			if loc.Bytes != b.Size || loc.LifeCycle != lg {
				return nil, fmt.Errorf("fakeengine: SSM layer %d buffer %q: config does not match the manager's layout", l.LayerID, b.Role)
			}
			e.ssm = append(e.ssm, buffer{layer: l.LayerID, role: b.Role, lg: lg, tokBytes: b.Size,
				salt: bufferSalt(l.LayerID, b.Role)})
			e.scratch = max(e.scratch, b.Size)
		}
	}
	return e, nil
}

// stateSeed is the prefix hash a state after n positions derives from.
func (e *Engine) stateSeed(hashes []uint64, n int) uint64 {
	if n == 0 {
		return chainStart(e.opts.Seed)
	}
	return hashes[n-1]
}

// ExpectedState returns the bytes the fake model gives the state of SSM
// buffer (layer, role) after the first n tokens.
func (e *Engine) ExpectedState(tokens []config.Token, n int, layer int32, role config.DataRole) ([]byte, error) {
	bi := slices.IndexFunc(e.ssm, func(b buffer) bool { return b.layer == layer && b.role == role })
	if bi < 0 {
		return nil, fmt.Errorf("fakeengine: no SSM buffer %q in layer %d", role, layer)
	}
	if n < 0 || n > len(tokens) {
		return nil, fmt.Errorf("fakeengine: state after %d of %d tokens", n, len(tokens))
	}
	out := make([]byte, e.ssm[bi].tokBytes)
	fillToken(out, e.stateSeed(appendPrefixHashes(nil, e.opts.Seed, tokens[:n]), n), n, e.ssm[bi].salt, e.opts.ZeroLowBytes)
	return out, nil
}

// VerifyState reads back the SSM state of c (which must be ACTIVE) and
// compares it with the fake model's state after the first n tokens, counting
// it as one page. Mismatches are counted, not returned as errors.
func (e *Engine) VerifyState(c *core.KVCache, tokens []config.Token, n int) (VerifyResult, error) {
	var res VerifyResult
	if err := checkRange(tokens, 0, n); err != nil {
		return res, err
	}
	if len(e.ssm) == 0 {
		return res, fmt.Errorf("fakeengine: no SSM layers: %w", core.ErrInvalidArgument)
	}
	stream, err := activeStream(c)
	if err != nil {
		return res, err
	}
	err = e.verifyState(c, stream, appendPrefixHashes(nil, e.opts.Seed, tokens[:n]), n, &res)
	e.pagesVerified.Add(res.PagesVerified)
	e.mismatches.Add(res.Mismatches)
	return res, err
}

// stateSegments lists the state pages of c's SSM buffers, in e.ssm order.
func (e *Engine) stateSegments(c *core.KVCache) ([]device.Ptr, error) {
	slot, err := c.SsmBlockBaseIndex(e.ssmLG)
	if err != nil {
		return nil, err
	}
	if slot == core.BadPageIndex {
		return nil, fmt.Errorf("fakeengine: cache %d has no SSM state", c.ID())
	}
	out := make([]device.Ptr, len(e.ssm))
	for i, b := range e.ssm {
		loc, err := e.m.Buffer(b.layer, b.role)
		if err != nil {
			return nil, err
		}
		out[i] = loc.PoolBase.Add(loc.PageIndex(slot) * loc.Bytes)
	}
	return out, nil
}

// writeState writes the state after n positions into c's state page.
func (e *Engine) writeState(c *core.KVCache, stream device.Stream, hashes []uint64, n int) error {
	pages, err := e.stateSegments(c)
	if err != nil {
		return err
	}
	scratch, err := e.getScratch()
	if err != nil {
		return err
	}
	defer e.putScratch(scratch)
	for i, b := range e.ssm {
		fillToken(scratch.Host()[:b.tokBytes], e.stateSeed(hashes, n), n, b.salt, e.opts.ZeroLowBytes)
		if err := stream.BatchCopy([]device.CopyDesc{{Dst: pages[i], Src: scratch.Ptr(), Size: b.tokBytes}}); err != nil {
			return fmt.Errorf("fakeengine: write the state of cache %d: %w", c.ID(), err)
		}
		if err := stream.Synchronize(); err != nil {
			return fmt.Errorf("fakeengine: write the state of cache %d: %w", c.ID(), err)
		}
		e.bytesWritten.Add(b.tokBytes)
	}
	return nil
}

// verifyState checks c's state page against the state after n positions,
// counting it as one verified page.
func (e *Engine) verifyState(c *core.KVCache, stream device.Stream, hashes []uint64, n int, res *VerifyResult) error {
	pages, err := e.stateSegments(c)
	if err != nil {
		return err
	}
	scratch, err := e.getScratch()
	if err != nil {
		return err
	}
	defer e.putScratch(scratch)
	want := make([]byte, 0, e.scratch)
	for i, b := range e.ssm {
		if err := stream.BatchCopy([]device.CopyDesc{{Dst: scratch.Ptr(), Src: pages[i], Size: b.tokBytes}}); err != nil {
			return fmt.Errorf("fakeengine: read the state of cache %d: %w", c.ID(), err)
		}
		if err := stream.Synchronize(); err != nil {
			return fmt.Errorf("fakeengine: read the state of cache %d: %w", c.ID(), err)
		}
		want = want[:b.tokBytes]
		fillToken(want, e.stateSeed(hashes, n), n, b.salt, e.opts.ZeroLowBytes)
		got := scratch.Host()[:b.tokBytes]
		e.bytesVerified.Add(b.tokBytes)
		if string(got) == string(want) {
			continue
		}
		res.Mismatches++
		if res.First == nil {
			off := 0
			for got[off] == want[off] {
				off++
			}
			res.First = &Mismatch{CacheID: c.ID(), Block: -1, Layer: b.layer, Role: b.role, Position: n,
				Offset: off, Got: got[off], Want: want[off]}
		}
	}
	res.PagesVerified++
	return nil
}

// Close frees the engine's scratch memory. Call it before closing the
// manager (which may close the device); later calls fail with ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	for _, m := range e.all {
		errs = append(errs, m.Free())
	}
	e.all, e.free = nil, nil
	return errors.Join(errs...)
}

// Stats returns the cumulative counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	first := e.first
	e.mu.Unlock()
	return Stats{
		PagesVerified: e.pagesVerified.Load(),
		PagesSkipped:  e.pagesSkipped.Load(),
		Mismatches:    e.mismatches.Load(),
		BytesWritten:  e.bytesWritten.Load(),
		BytesVerified: e.bytesVerified.Load(),
		FirstMismatch: first,
	}
}

// PagesVerified, Mismatches and BytesWritten are the counters of Stats.
func (e *Engine) PagesVerified() int64 { return e.pagesVerified.Load() }
func (e *Engine) Mismatches() int64    { return e.mismatches.Load() }
func (e *Engine) BytesWritten() int64  { return e.bytesWritten.Load() }

// TokenBytes is the KV bytes one position occupies across every buffer.
func (e *Engine) TokenBytes() int64 {
	var n int64
	for _, b := range e.bufs {
		n += b.tokBytes
	}
	return n
}

// NextToken is the token the fake model generates after tokens.
func (e *Engine) NextToken(tokens []config.Token) config.Token {
	h := chainStart(e.opts.Seed)
	for _, t := range tokens {
		h = chainNext(h, t)
	}
	return nextToken(h, e.opts.Vocab)
}

// ExpectedKV returns the bytes the fake model gives position pos of
// tokens (pos < len(tokens)) in buffer (layer, role).
func (e *Engine) ExpectedKV(tokens []config.Token, pos int, layer int32, role config.DataRole) ([]byte, error) {
	bi := slices.IndexFunc(e.bufs, func(b buffer) bool { return b.layer == layer && b.role == role })
	if bi < 0 {
		return nil, fmt.Errorf("fakeengine: no buffer %q in layer %d", role, layer)
	}
	if pos < 0 || pos >= len(tokens) {
		return nil, fmt.Errorf("fakeengine: position %d out of [0, %d)", pos, len(tokens))
	}
	h := appendPrefixHashes(nil, e.opts.Seed, tokens[:pos+1])
	out := make([]byte, e.bufs[bi].tokBytes)
	fillToken(out, h[pos], pos, e.bufs[bi].salt, e.opts.ZeroLowBytes)
	return out, nil
}

// segment is a run of consecutive positions of one buffer within one block:
// contiguous bytes of a page.
type segment struct {
	buf      int
	block    int
	pos, n   int // first position and count
	dev      device.Ptr
	size     int64
	firstOfP bool // first segment of its (block, layer group) page
}

// plan lists the segments of positions [from, to) of beam's pages of c.
// Positions whose block has no page fail the plan when strict, and are
// skipped (counted in skipped, per page) otherwise; when strict (a write), a
// block the cache's step computes in SWA scratch slots
// (core.KVCache.ScratchDesc) is written there, each layer at its scratch page
// index, as a kernel computing one layer at a time would.
func (e *Engine) plan(c *core.KVCache, beam, from, to int, strict bool) (segs []segment, skipped int64, err error) {
	if from >= to {
		return nil, 0, nil
	}
	tpb := e.tpb
	var idx []int32
	for lg, bis := range e.byLG {
		if len(bis) == 0 {
			continue
		}
		idx, err = c.AppendBasePageIndicesOfBeam(idx[:0], layout.LayerGroupID(lg), beam)
		if err != nil {
			return nil, 0, err
		}
		locs := make([]core.BufferLocation, len(bis))
		for i, bi := range bis {
			if locs[i], err = e.m.Buffer(e.bufs[bi].layer, e.bufs[bi].role); err != nil {
				return nil, 0, err
			}
		}
		var scratch core.ScratchDesc
		if strict {
			if scratch, err = c.ScratchDesc(layout.LayerGroupID(lg)); err != nil {
				return nil, 0, err
			}
		}
		for b := from / tpb; b*tpb < to; b++ {
			lo, hi := max(from, b*tpb), min(to, (b+1)*tpb)
			if b >= scratch.Begin && b < scratch.End {
				for i, bi := range bis {
					tb := e.bufs[bi].tokBytes
					page := locs[i].PoolBase.Add(locs[i].ScratchPageIndex(scratch, b) * locs[i].Bytes)
					segs = append(segs, segment{
						buf: bi, block: b, pos: lo, n: hi - lo,
						dev: page.Add(int64(lo-b*tpb) * tb), size: int64(hi-lo) * tb, firstOfP: i == 0,
					})
				}
				continue
			}
			if b >= len(idx) || idx[b] == core.BadPageIndex {
				if strict {
					return nil, 0, fmt.Errorf("fakeengine: cache %d has no page for block %d of layer group %d (positions %d..%d); resize first",
						c.ID(), b, lg, lo, hi-1)
				}
				skipped++
				continue
			}
			for i, bi := range bis {
				tb := e.bufs[bi].tokBytes
				page := locs[i].PoolBase.Add(locs[i].PageIndex(idx[b]) * locs[i].Bytes)
				segs = append(segs, segment{
					buf: bi, block: b, pos: lo, n: hi - lo,
					dev: page.Add(int64(lo-b*tpb) * tb), size: int64(hi-lo) * tb, firstOfP: i == 0,
				})
			}
		}
	}
	return segs, skipped, nil
}

// getScratch takes an idle scratch buffer, allocating one if none is idle.
func (e *Engine) getScratch() (device.Memory, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if n := len(e.free); n > 0 {
		s := e.free[n-1]
		e.free = e.free[:n-1]
		return s, nil
	}
	s, err := e.dev.Alloc(device.HostMapped, e.scratch)
	if err != nil {
		return nil, fmt.Errorf("fakeengine: allocate scratch: %w", err)
	}
	e.all = append(e.all, s)
	return s, nil
}

func (e *Engine) putScratch(s device.Memory) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed {
		e.free = append(e.free, s)
	}
}

// rounds splits segs into consecutive runs that fit one scratch buffer and
// calls fn for each with the scratch offset of every segment.
func (e *Engine) rounds(segs []segment, fn func(run []segment, offs []int64) error) error {
	offs := make([]int64, 0, len(segs))
	for start := 0; start < len(segs); {
		offs = offs[:0]
		var used int64
		end := start
		for end < len(segs) && used+segs[end].size <= e.scratch {
			offs = append(offs, used)
			used += segs[end].size
			end++
		}
		if err := fn(segs[start:end], offs); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// activeStream returns the stream of an ACTIVE cache.
func activeStream(c *core.KVCache) (device.Stream, error) {
	s := c.Stream()
	if s == nil {
		return nil, fmt.Errorf("fakeengine: cache %d is %v, not ACTIVE: %w", c.ID(), c.Status(), core.ErrInvalidState)
	}
	return s, nil
}

func checkRange(tokens []config.Token, from, to int) error {
	if from < 0 || from > to || to > len(tokens) {
		return fmt.Errorf("fakeengine: positions [%d, %d) out of a sequence of %d tokens: %w",
			from, to, len(tokens), core.ErrInvalidArgument)
	}
	return nil
}

// Step computes positions [from, to) of the sequence tokens into c: it
// writes their KV into c's pages, and with SSM layers the state after to
// positions into c's state page, on c's stream and waits for the copy. The
// cache must be ACTIVE with pages for every position (Resize to a capacity of
// at least to, with a history length of at most from). It covers a prefill
// chunk and a decode step alike.
func (e *Engine) Step(c *core.KVCache, tokens []config.Token, from, to int) error {
	return e.StepBeam(c, core.DefaultBeamIndex, tokens, from, to)
}

// StepBeam is Step into beam's pages: tokens is that beam's hypothesis.
func (e *Engine) StepBeam(c *core.KVCache, beam int, tokens []config.Token, from, to int) error {
	if err := checkRange(tokens, from, to); err != nil {
		return err
	}
	return e.step(c, beam, tokens, appendPrefixHashes(nil, e.opts.Seed, tokens[:to]), from, to)
}

// step is StepBeam with the prefix hashes of at least tokens[:to] given.
func (e *Engine) step(c *core.KVCache, beam int, tokens []config.Token, hashes []uint64, from, to int) error {
	if e.opts.NoData || from == to {
		return nil
	}
	stream, err := activeStream(c)
	if err != nil {
		return err
	}
	segs, _, err := e.plan(c, beam, from, to, true)
	if err != nil {
		return err
	}
	if len(e.ssm) > 0 {
		if err := e.writeState(c, stream, hashes, to); err != nil {
			return err
		}
	}
	scratch, err := e.getScratch()
	if err != nil {
		return err
	}
	defer e.putScratch(scratch)
	host, base := scratch.Host(), scratch.Ptr()
	descs := make([]device.CopyDesc, 0, len(segs))
	return e.rounds(segs, func(run []segment, offs []int64) error {
		descs = descs[:0]
		var n int64
		for i, s := range run {
			b := &e.bufs[s.buf]
			for k := 0; k < s.n; k++ {
				p := s.pos + k
				o := offs[i] + int64(k)*b.tokBytes
				fillToken(host[o:o+b.tokBytes], hashes[p], p, b.salt, e.opts.ZeroLowBytes)
			}
			descs = append(descs, device.CopyDesc{Dst: s.dev, Src: base.Add(offs[i]), Size: s.size})
			n += s.size
		}
		if err := stream.BatchCopy(descs); err != nil {
			return fmt.Errorf("fakeengine: write cache %d: %w", c.ID(), err)
		}
		if err := stream.Synchronize(); err != nil {
			return fmt.Errorf("fakeengine: write cache %d: %w", c.ID(), err)
		}
		e.bytesWritten.Add(n)
		return nil
	})
}

// Verify reads back positions [from, to) of c (which must be ACTIVE) on its
// stream and compares them with the fake model's KV of tokens. Positions
// whose block has no page in a layer group (released by a sliding window) and
// positions at or beyond the capacity are skipped. With SSM layers, when to
// is the cache's history length, the state is checked too (one page).
// Mismatches are counted, not returned as errors; the error reports only
// failed calls.
func (e *Engine) Verify(c *core.KVCache, tokens []config.Token, from, to int) (VerifyResult, error) {
	return e.VerifyBeam(c, core.DefaultBeamIndex, tokens, from, to)
}

// VerifyBeam is Verify of beam's pages against that beam's hypothesis
// tokens.
func (e *Engine) VerifyBeam(c *core.KVCache, beam int, tokens []config.Token, from, to int) (VerifyResult, error) {
	if err := checkRange(tokens, from, to); err != nil {
		return VerifyResult{}, err
	}
	return e.verify(c, beam, tokens, appendPrefixHashes(nil, e.opts.Seed, tokens[:to]), from, to)
}

func (e *Engine) verify(c *core.KVCache, beam int, tokens []config.Token, hashes []uint64, from, to int) (VerifyResult, error) {
	var res VerifyResult
	if e.opts.NoData || from == to {
		return res, nil
	}
	stream, err := activeStream(c)
	if err != nil {
		return res, err
	}
	if len(e.ssm) > 0 && to == c.HistoryLength() {
		if err := e.verifyState(c, stream, hashes, to, &res); err != nil {
			return res, err
		}
	}
	// Positions at or beyond the capacity have no KV even where their
	// block has a page.
	to = min(to, c.Capacity())
	segs, skipped, err := e.plan(c, beam, from, to, false)
	if err != nil {
		return res, err
	}
	res.PagesSkipped = skipped
	scratch, err := e.getScratch()
	if err != nil {
		return res, err
	}
	defer e.putScratch(scratch)
	host, base := scratch.Host(), scratch.Ptr()
	descs := make([]device.CopyDesc, 0, len(segs))
	var want []byte
	var bytes int64
	err = e.rounds(segs, func(run []segment, offs []int64) error {
		descs = descs[:0]
		for i, s := range run {
			descs = append(descs, device.CopyDesc{Dst: base.Add(offs[i]), Src: s.dev, Size: s.size})
		}
		if err := stream.BatchCopy(descs); err != nil {
			return fmt.Errorf("fakeengine: read cache %d: %w", c.ID(), err)
		}
		if err := stream.Synchronize(); err != nil {
			return fmt.Errorf("fakeengine: read cache %d: %w", c.ID(), err)
		}
		for i, s := range run {
			b := &e.bufs[s.buf]
			if s.firstOfP {
				res.PagesVerified++
			}
			for k := 0; k < s.n; k++ {
				p := s.pos + k
				o := offs[i] + int64(k)*b.tokBytes
				want = slices.Grow(want[:0], int(b.tokBytes))[:b.tokBytes]
				fillToken(want, hashes[p], p, b.salt, e.opts.ZeroLowBytes)
				got := host[o : o+b.tokBytes]
				if string(got) == string(want) {
					continue
				}
				res.Mismatches++
				if res.First == nil {
					off := 0
					for got[off] == want[off] {
						off++
					}
					res.First = &Mismatch{CacheID: c.ID(), Block: s.block, Layer: b.layer, Role: b.role,
						Position: p, Offset: off, Got: got[off], Want: want[off]}
				}
			}
			bytes += s.size
		}
		return nil
	})
	e.pagesVerified.Add(res.PagesVerified)
	e.pagesSkipped.Add(res.PagesSkipped)
	e.mismatches.Add(res.Mismatches)
	e.bytesVerified.Add(bytes)
	if res.First != nil {
		e.mu.Lock()
		if e.first == nil {
			e.first = res.First
		}
		e.mu.Unlock()
	}
	return res, err
}

// Corrupt flips every bit of one byte of position pos in buffer (layer,
// role) of c (which must be ACTIVE and hold a page there), through the
// device on c's stream, so tests can check that Verify notices. offset is
// the byte within the position's bytes.
func (e *Engine) Corrupt(c *core.KVCache, pos int, layer int32, role config.DataRole, offset int) error {
	if e.opts.NoData {
		return nil
	}
	stream, err := activeStream(c)
	if err != nil {
		return err
	}
	bi := slices.IndexFunc(e.bufs, func(b buffer) bool { return b.layer == layer && b.role == role })
	if bi < 0 {
		return fmt.Errorf("fakeengine: no buffer %q in layer %d", role, layer)
	}
	b := e.bufs[bi]
	if pos < 0 || offset < 0 || int64(offset) >= b.tokBytes {
		return fmt.Errorf("fakeengine: corrupt position %d byte %d: out of range: %w", pos, offset, core.ErrInvalidArgument)
	}
	idx, err := c.BasePageIndices(b.lg)
	if err != nil {
		return err
	}
	blk := pos / e.tpb
	if blk >= len(idx) || idx[blk] == core.BadPageIndex {
		return fmt.Errorf("fakeengine: cache %d has no page for position %d in layer %d", c.ID(), pos, layer)
	}
	loc, err := e.m.Buffer(layer, role)
	if err != nil {
		return err
	}
	addr := loc.PoolBase.Add(loc.PageIndex(idx[blk])*loc.Bytes + int64(pos%e.tpb)*b.tokBytes + int64(offset))
	scratch, err := e.getScratch()
	if err != nil {
		return err
	}
	defer e.putScratch(scratch)
	if err := stream.BatchCopy([]device.CopyDesc{{Dst: scratch.Ptr(), Src: addr, Size: 1}}); err != nil {
		return err
	}
	if err := stream.Synchronize(); err != nil {
		return err
	}
	scratch.Host()[0] ^= 0xff
	if err := stream.BatchCopy([]device.CopyDesc{{Dst: addr, Src: scratch.Ptr(), Size: 1}}); err != nil {
		return err
	}
	return stream.Synchronize()
}
