// Package conformance runs the cross-language conformance vectors (*.vec, see
// README.md) against the Go API. The C++ and Python bindings run the same
// vectors through libkvcm and must meet the same expectations.
//
// With KVCM_CONFORMANCE_RECORD=1 an expectation written "?" is accepted and
// the test logs the vector with every "?" replaced by the value it observed.
package conformance

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

func TestVectors(t *testing.T) {
	files, err := filepath.Glob("*.vec")
	if err != nil || len(files) == 0 {
		t.Fatalf("no vectors: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(f, ".vec"), func(t *testing.T) { runVector(t, f) })
	}
}

type line struct {
	no     int
	fields []string
}

type runner struct {
	t      *testing.T
	record bool
	lines  []string // the file, for record mode
	cfg    config.Config
	seed   uint64
	seqs   map[string][]config.Token
	m      *core.Manager
	eng    *fakeengine.Engine
	stream device.Stream
	caches map[string]*core.KVCache
	cseq   map[string][]config.Token
}

func runVector(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{t: t, record: os.Getenv("KVCM_CONFORMANCE_RECORD") == "1",
		seqs: map[string][]config.Token{}, caches: map[string]*core.KVCache{}, cseq: map[string][]config.Token{}}
	r.lines = strings.Split(string(data), "\n")
	var steps []line
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	no := 0
	for sc.Scan() {
		no++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		if no == 1 || steps == nil && f[0] == "kvcm-conformance" {
			if len(f) != 2 || f[0] != "kvcm-conformance" || f[1] != "1" {
				t.Fatalf("%s:%d: want header \"kvcm-conformance 1\"", path, no)
			}
			continue
		}
		steps = append(steps, line{no, f})
	}
	for _, l := range steps {
		if !r.configure(l) {
			if r.m == nil {
				r.start()
			}
			r.step(l)
		}
	}
	for name, c := range r.caches {
		if err := c.Close(); err != nil {
			t.Errorf("close %s: %v", name, err)
		}
	}
	if r.eng != nil {
		r.eng.Close()
	}
	if r.stream != nil {
		r.stream.Close()
	}
	if r.m != nil {
		if err := r.m.Close(); err != nil {
			t.Errorf("close manager: %v", err)
		}
	}
	if r.record {
		t.Logf("recorded vector:\n%s", strings.Join(r.lines, "\n"))
	}
}

func atoi(t *testing.T, l line, s string) int64 {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("line %d: %q is not an integer", l.no, s)
	}
	return v
}

// configure handles configuration lines; false means l is a step.
func (r *runner) configure(l line) bool {
	t, f := r.t, l.fields
	switch f[0] {
	case "tokens_per_block":
		r.cfg.TokensPerBlock = int(atoi(t, l, f[1]))
	case "tier":
		q := atoi(t, l, f[2])
		switch f[1] {
		case "gpu":
			r.cfg.CacheTiers = append(r.cfg.CacheTiers, config.GPU(q))
		case "host":
			r.cfg.CacheTiers = append(r.cfg.CacheTiers, config.Host(q))
		default:
			t.Fatalf("line %d: tier %q not supported by the conformance format", l.no, f[1])
		}
	case "layer":
		lc := config.AttentionLayerConfig{LayerID: int32(atoi(t, l, f[1])),
			SlidingWindowSize: int(atoi(t, l, f[2])), NumSinkTokens: int(atoi(t, l, f[3]))}
		for i := 4; i+1 < len(f); i += 2 {
			lc.Buffers = append(lc.Buffers, config.BufferConfig{Role: config.DataRole(f[i]), Size: atoi(t, l, f[i+1])})
		}
		r.cfg.Layers = append(r.cfg.Layers, lc)
	case "ssm_layer":
		sl := config.SsmLayerConfig{LayerID: int32(atoi(t, l, f[1]))}
		for i := 2; i+1 < len(f); i += 2 {
			sl.Buffers = append(sl.Buffers, config.BufferConfig{Role: config.DataRole(f[i]), Size: atoi(t, l, f[i+1])})
		}
		r.cfg.SsmLayers = append(r.cfg.SsmLayers, sl)
		r.cfg.CommitMinSnapshot = true
	case "partial_reuse":
		r.cfg.EnablePartialReuse = f[1] == "on"
	case "reuse_match_backoff":
		r.cfg.ReuseMatchBackoff = int(atoi(t, l, f[1]))
	case "seed":
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			t.Fatalf("line %d: seed: %v", l.no, err)
		}
		r.seed = v
	case "seq":
		toks := make([]config.Token, 0, len(f)-2)
		for _, s := range f[2:] {
			toks = append(toks, config.Token(atoi(t, l, s)))
		}
		r.seqs[f[1]] = toks
	default:
		return false
	}
	return true
}

func (r *runner) start() {
	m, err := core.NewManager(r.cfg)
	if err != nil {
		r.t.Fatalf("create manager: %v", err)
	}
	r.m = m
	if r.eng, err = fakeengine.New(m, r.cfg, fakeengine.Options{Seed: r.seed}); err != nil {
		r.t.Fatal(err)
	}
	if r.stream, err = m.Device().NewStream(); err != nil {
		r.t.Fatal(err)
	}
}

// expect compares got with the expectation in field i of l ("?" records).
func (r *runner) expect(l line, i int, got string) {
	want := l.fields[i]
	if want == "?" {
		if !r.record {
			r.t.Fatalf("line %d: expectation \"?\" (run with KVCM_CONFORMANCE_RECORD=1 to fill it in)", l.no)
		}
		r.t.Logf("line %d: %s -> %s", l.no, strings.Join(l.fields, " "), got)
		f := strings.Fields(r.lines[l.no-1])
		f[i] = got
		l.fields[i] = got
		r.lines[l.no-1] = strings.Join(f, " ")
		return
	}
	if want != got {
		r.t.Fatalf("line %d (%s): got %s, want %s", l.no, strings.Join(l.fields, " "), got, want)
	}
}

// scope is the reuse scope of a LORA field: "-" has no LoRA adapter, an
// integer is that adapter (0 included).
func (r *runner) scope(l line, field string) blockhash.Scope {
	if field == "-" {
		return blockhash.Scope{}
	}
	return blockhash.LoRA(atoi(r.t, l, field))
}

func (r *runner) cache(l line) *core.KVCache {
	c := r.caches[l.fields[1]]
	if c == nil {
		r.t.Fatalf("line %d: no open cache %q", l.no, l.fields[1])
	}
	return c
}

func (r *runner) step(l line) {
	t, f := r.t, l.fields
	must := func(err error) {
		if err != nil {
			t.Fatalf("line %d (%s): %v", l.no, strings.Join(f, " "), err)
		}
	}
	switch f[0] {
	case "probe":
		n := r.m.ProbeReuse(r.scope(l, f[2]), r.seqs[f[1]])
		r.expect(l, 3, strconv.Itoa(n))
	case "create":
		seq := r.seqs[f[2]]
		c, err := r.m.CreateKVCache(core.CacheOptions{Scope: r.scope(l, f[3]), InputTokens: seq})
		must(err)
		r.caches[f[1]], r.cseq[f[1]] = c, seq
		if c.NumCommittedTokens() != c.HistoryLength() {
			t.Fatalf("line %d: committed %d != history %d after create", l.no, c.NumCommittedTokens(), c.HistoryLength())
		}
		r.expect(l, 4, strconv.Itoa(c.HistoryLength()))
	case "resume":
		must(r.cache(l).Resume(r.stream))
	case "suspend":
		must(r.cache(l).Suspend())
	case "close":
		must(r.cache(l).Close())
		delete(r.caches, f[1])
	case "resize":
		must(r.cache(l).Resize(int(atoi(t, l, f[2])), int(atoi(t, l, f[3]))))
	case "write":
		must(r.eng.Step(r.cache(l), r.cseq[f[1]], int(atoi(t, l, f[2])), int(atoi(t, l, f[3]))))
	case "commit":
		c, seq := r.cache(l), r.cseq[f[1]]
		from, to := int(atoi(t, l, f[2])), int(atoi(t, l, f[3]))
		if from != c.NumCommittedTokens() {
			t.Fatalf("line %d: commit from %d, but %d tokens are committed", l.no, from, c.NumCommittedTokens())
		}
		must(c.Commit(seq[from:to], f[4] == "end"))
	case "pages":
		c := r.cache(l)
		lg, err := r.m.LayerGroupOf(int32(atoi(t, l, f[2])))
		must(err)
		idx, err := c.BasePageIndices(lg)
		must(err)
		valid := 0
		for _, x := range idx {
			if x != core.BadPageIndex {
				valid++
			}
		}
		r.expect(l, 3, strconv.Itoa(len(idx)))
		r.expect(l, 4, strconv.Itoa(valid))
	case "verify":
		c, seq := r.cache(l), r.cseq[f[1]]
		from, to := int(atoi(t, l, f[2])), int(atoi(t, l, f[3]))
		res, err := r.eng.Verify(c, seq, from, to)
		must(err)
		if res.Mismatches != 0 {
			t.Fatalf("line %d: %d mismatches, first %v", l.no, res.Mismatches, res.First)
		}
		r.expect(l, 4, r.digest(l, c, seq, from, to))
	case "state":
		c, seq := r.cache(l), r.cseq[f[1]]
		n := int(atoi(t, l, f[2]))
		res, err := r.eng.VerifyState(c, seq, n)
		must(err)
		if res.Mismatches != 0 {
			t.Fatalf("line %d: the SSM state differs from the writer's after %d tokens: %v", l.no, n, res.First)
		}
		r.expect(l, 3, r.stateDigest(seq, n))
	case "used":
		st, err := r.m.StorageStats(layout.CacheLevel(atoi(t, l, f[1])))
		must(err)
		var used int64
		for _, g := range st {
			used += g.Total - g.Free
		}
		r.expect(l, 2, strconv.FormatInt(used, 10))
	default:
		t.Fatalf("line %d: unknown step %q", l.no, f[0])
	}
}

// stateDigest is FNV-1a 64 over the writer's SSM state after n tokens of
// every SSM buffer, in ascending layer id and configuration order.
func (r *runner) stateDigest(seq []config.Token, n int) string {
	layers := append([]config.SsmLayerConfig(nil), r.cfg.SsmLayers...)
	for i := 1; i < len(layers); i++ {
		for j := i; j > 0 && layers[j].LayerID < layers[j-1].LayerID; j-- {
			layers[j], layers[j-1] = layers[j-1], layers[j]
		}
	}
	h := fnv.New64a()
	for _, ly := range layers {
		for _, b := range ly.Buffers {
			st, err := r.eng.ExpectedState(seq, n, ly.LayerID, b.Role)
			if err != nil {
				r.t.Fatal(err)
			}
			h.Write(st)
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// digest is FNV-1a 64 over the expected bytes of positions [from, to) of
// every buffer, in README order, skipping blocks without a page. Verify has
// checked that the pages hold exactly these bytes.
func (r *runner) digest(l line, c *core.KVCache, seq []config.Token, from, to int) string {
	t := r.t
	type buf struct {
		layer int32
		role  config.DataRole
		idx   []int32
	}
	var bufs []buf
	layers := append([]config.AttentionLayerConfig(nil), r.cfg.Layers...)
	for i := 1; i < len(layers); i++ { // ascending layer id
		for j := i; j > 0 && layers[j].LayerID < layers[j-1].LayerID; j-- {
			layers[j], layers[j-1] = layers[j-1], layers[j]
		}
	}
	for _, ly := range layers {
		lg, err := r.m.LayerGroupOf(ly.LayerID)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := c.BasePageIndices(lg)
		if err != nil {
			t.Fatalf("line %d: %v", l.no, err)
		}
		for _, b := range ly.Buffers {
			bufs = append(bufs, buf{ly.LayerID, b.Role, idx})
		}
	}
	h := fnv.New64a()
	tpb := r.cfg.TokensPerBlock
	for pos := from; pos < to; pos++ {
		for _, b := range bufs {
			blk := pos / tpb
			if blk >= len(b.idx) || b.idx[blk] == core.BadPageIndex {
				continue
			}
			kv, err := r.eng.ExpectedKV(seq, pos, b.layer, b.role)
			if err != nil {
				t.Fatal(err)
			}
			h.Write(kv)
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}
