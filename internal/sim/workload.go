package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Kind names a workload family of EVALUATION.md §3.
type Kind string

// Workload families.
const (
	// W1: shared prefix, SGLang's defaults.
	W1 Kind = "w1"
	// W2: shared prefix under cache pressure, Zipf group popularity.
	W2 Kind = "w2"
	// W4: multi-turn sessions, closed loop with think time.
	W4 Kind = "w4"
	// W5: control without overlap.
	W5 Kind = "w5"
	// RAG: retrieval-augmented prompts that share a system prompt and only
	// some leading documents.
	RAG Kind = "rag"
	// Replay: traces given from outside (for example JSONL files).
	Replay Kind = "trace"
)

// DefaultCapacityTokens is the KV capacity of workloads without a
// footprint-relative one: about what an 8B model with 16-bit KV (128 KiB a
// token) has left on an 80 GB GPU.
const DefaultCapacityTokens = 480_000

// Workload describes a seeded trace generator and the KV capacity it runs
// with. Build one with NewW1, NewW2, NewW4, NewW5, NewRAG, FromTraces or
// ParseWorkload; fields may be shrunk for tests.
type Workload struct {
	Kind Kind
	// W1, W2: Groups × PerGroup prompts (W2: PerGroup on average, groups
	// drawn with Zipf popularity Alpha; 0 is uniform), each a SystemLen
	// system prompt of its group and a QuestionLen question.
	Groups, PerGroup, SystemLen, QuestionLen int
	Alpha                                    float64
	// W4: Sessions of MinTurns..MaxTurns turns, UserLen user tokens and an
	// OutputLen answer each, exponential think time of mean ThinkMean
	// seconds, after a SystemLen system prompt shared by all.
	Sessions, MinTurns, MaxTurns, UserLen int
	ThinkMean                             float64
	// W5: Requests random PromptLen-token prompts.
	Requests, PromptLen int
	// RAG: Requests prompts, each the SystemLen system prompt shared by all,
	// K documents of DocLen tokens retrieved from one of Topics topic
	// clusters of Docs documents each, and a QuestionLen question. The
	// topic is drawn with Zipf popularity Alpha, the K documents without
	// replacement from the topic with Zipf popularity DocAlpha, and they are
	// placed in rank order (most popular first), so two prompts of a topic
	// share a prefix as far as their leading documents agree.
	Topics, Docs, K, DocLen int
	DocAlpha                float64
	// OutputLen is the number of generated tokens of every request.
	OutputLen int
	// CapacityFactor > 0 sets the KV capacity to that fraction of the
	// footprint (Footprint); otherwise CapacityTokens is used.
	CapacityFactor float64
	CapacityTokens int64
	// Traces (Kind Replay) are given traces, one a seed: the i-th seed of
	// an experiment replays Traces[i]. The other fields but CapacityTokens
	// are ignored.
	Traces []*Trace
}

// FromTraces is a workload replaying the traces, one a seed, with the
// default capacity.
func FromTraces(trs ...*Trace) Workload {
	return Workload{Kind: Replay, Traces: trs, CapacityTokens: DefaultCapacityTokens}
}

// NewW1 is 64 groups × 16 prompts, system 2048, question 128, output 256.
func NewW1() Workload {
	return Workload{Kind: W1, Groups: 64, PerGroup: 16, SystemLen: 2048, QuestionLen: 128, OutputLen: 256,
		CapacityTokens: DefaultCapacityTokens}
}

// NewW2 is 256 groups × 16 (on average), system 4096, question 128, output
// 128, Zipf alpha, capacity capFactor × the distinct-prefix footprint.
func NewW2(alpha, capFactor float64) Workload {
	return Workload{Kind: W2, Groups: 256, PerGroup: 16, SystemLen: 4096, QuestionLen: 128, OutputLen: 128,
		Alpha: alpha, CapacityFactor: capFactor}
}

// NewW4 is 200 sessions × 4–8 turns, 100 user and 200 assistant tokens a
// turn, think time exponential with mean 5 s, shared system prompt 1024.
func NewW4() Workload {
	return Workload{Kind: W4, Sessions: 200, MinTurns: 4, MaxTurns: 8, UserLen: 100, OutputLen: 200,
		ThinkMean: 5, SystemLen: 1024, CapacityTokens: DefaultCapacityTokens}
}

// NewW5 is 1024 random 2176-token prompts, output 256.
func NewW5() Workload {
	return Workload{Kind: W5, Requests: 1024, PromptLen: 2176, OutputLen: 256, CapacityTokens: DefaultCapacityTokens}
}

// NewRAG is 4096 requests over a shared 1024-token system prompt and 4 of
// 32 documents of 384 tokens from one of 64 topics (topic Zipf 0.8,
// document Zipf 1.0), a 64-token question, output 128, KV capacity 0.25×
// the footprint (the system prompt and the 786,432-token corpus).
func NewRAG() Workload {
	return Workload{Kind: RAG, Requests: 4096, SystemLen: 1024, Topics: 64, Docs: 32, K: 4, DocLen: 384,
		Alpha: 0.8, DocAlpha: 1, QuestionLen: 64, OutputLen: 128, CapacityFactor: 0.25}
}

// Name identifies the workload: w1, w2:0.8:0.25, w4, w5, rag, or
// trace:NAME[,NAME…] for replayed traces.
func (w Workload) Name() string {
	switch w.Kind {
	case Replay:
		names := make([]string, len(w.Traces))
		for i, t := range w.Traces {
			names[i] = t.Name
		}
		return "trace:" + strings.Join(names, ",")
	case W2:
		return fmt.Sprintf("w2:%s:%s", fmtF(w.Alpha), fmtF(w.CapacityFactor))
	}
	return string(w.Kind)
}

func fmtF(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

// ParseWorkload reads w1, w2:ALPHA:CAP (for example w2:0.8:0.25), w4, w5 or
// rag.
func ParseWorkload(s string) (Workload, error) {
	parts := strings.Split(strings.ToLower(strings.TrimSpace(s)), ":")
	switch parts[0] {
	case "w1", "w4", "w5", "rag":
		if len(parts) != 1 {
			return Workload{}, fmt.Errorf("sim: workload %q takes no parameters", s)
		}
		return map[string]Workload{"w1": NewW1(), "w4": NewW4(), "w5": NewW5(), "rag": NewRAG()}[parts[0]], nil
	case "w2":
		alpha, capf := 0.8, 0.25
		var err error
		if len(parts) > 3 {
			return Workload{}, fmt.Errorf("sim: workload %q: w2[:alpha[:capacity]]", s)
		}
		if len(parts) > 1 {
			if alpha, err = strconv.ParseFloat(parts[1], 64); err != nil || alpha < 0 {
				return Workload{}, fmt.Errorf("sim: workload %q: bad zipf alpha", s)
			}
		}
		if len(parts) > 2 {
			if capf, err = strconv.ParseFloat(parts[2], 64); err != nil || !(capf > 0) {
				return Workload{}, fmt.Errorf("sim: workload %q: bad capacity factor", s)
			}
		}
		return NewW2(alpha, capf), nil
	}
	return Workload{}, fmt.Errorf("sim: unknown workload %q (w1, w2:alpha:cap, w4, w5, rag)", s)
}

// Shrink divides the request counts (groups, sessions, requests) by f, at
// least one each: a quick version of the same shape.
func (w Workload) Shrink(f int) Workload {
	if f <= 1 {
		return w
	}
	div := func(n int) int { return max(1, n/f) }
	w.Groups, w.Sessions, w.Requests = div(w.Groups), div(w.Sessions), div(w.Requests)
	if w.CapacityFactor > 0 {
		return w // capacity follows the footprint
	}
	w.CapacityTokens = max(w.CapacityTokens/int64(f), 1)
	return w
}

// Footprint returns the tokens that can be shared, by specification: the
// distinct system prompts (W1, W2, W4), the system prompt and the corpus
// (RAG); 0 for W5 and replayed traces (see SharedPrefixTokens).
func (w Workload) Footprint() int64 {
	switch w.Kind {
	case W1, W2:
		return int64(w.Groups) * int64(w.SystemLen)
	case W4:
		return int64(w.SystemLen)
	case RAG:
		return int64(w.SystemLen) + int64(w.Topics)*int64(w.Docs)*int64(w.DocLen)
	}
	return 0
}

// Capacity returns the KV capacity in tokens.
func (w Workload) Capacity() int64 {
	if w.CapacityFactor > 0 {
		return int64(math.Round(w.CapacityFactor * float64(w.Footprint())))
	}
	return w.CapacityTokens
}

// Trace generates the workload's trace for a seed, with open-loop (Poisson)
// arrivals of mean rate 1 per second (W4: session starts); scale it with
// Trace.TimeScaled. A Replay workload has no generator: see Traces.
func (w Workload) Trace(seed uint64) *Trace {
	rng := rand.New(rand.NewPCG(seed, uint64(len(w.Kind))*0x9e3779b9))
	t := &Trace{Name: fmt.Sprintf("%s/seed%d", w.Name(), seed)}
	clock := 0.0
	arrive := func() float64 {
		clock += rng.ExpFloat64()
		return clock
	}
	switch w.Kind {
	case W1, W2:
		n := w.Groups * w.PerGroup
		groups := make([]int, n)
		if w.Kind == W1 {
			for i := range groups {
				groups[i] = i / w.PerGroup
			}
			rng.Shuffle(n, func(i, j int) { groups[i], groups[j] = groups[j], groups[i] })
		} else {
			z := newZipf(w.Groups, w.Alpha)
			for i := range groups {
				groups[i] = z.draw(rng)
			}
		}
		for i, g := range groups {
			id := fmt.Sprintf("%s-%05d", w.Kind, i)
			t.Requests = append(t.Requests, Request{
				ID: id, Arrival: arrive(), Output: w.OutputLen,
				Segments: []Segment{
					{Name: fmt.Sprintf("%s-sys%d", w.Kind, g), Len: w.SystemLen},
					{Name: fmt.Sprintf("%s-s%d-q", id, seed), Len: w.QuestionLen},
				},
			})
		}
	case W4:
		sys := Segment{Name: "w4-sys", Len: w.SystemLen}
		for s := 0; s < w.Sessions; s++ {
			sess := fmt.Sprintf("w4-s%d-%04d", seed, s)
			start := arrive()
			turns := w.MinTurns + rng.IntN(w.MaxTurns-w.MinTurns+1)
			segs := []Segment{sys}
			for k := 0; k < turns; k++ {
				segs = append(segs, Segment{Name: fmt.Sprintf("%s-u%d", sess, k), Len: w.UserLen})
				req := Request{
					ID: fmt.Sprintf("%s-t%d", sess, k), Session: sess, Turn: k, Output: w.OutputLen,
					Segments: slices.Clone(segs), OutputSeg: fmt.Sprintf("%s-a%d", sess, k),
				}
				if k == 0 {
					req.Arrival = start
				} else {
					req.Think = rng.ExpFloat64() * w.ThinkMean
				}
				t.Requests = append(t.Requests, req)
				segs = append(segs, Segment{Name: req.OutputSeg, Len: w.OutputLen})
			}
		}
	case RAG:
		topics := newZipf(w.Topics, w.Alpha)
		docs := newZipf(w.Docs, w.DocAlpha)
		sys := Segment{Name: "rag-sys", Len: w.SystemLen}
		for i := 0; i < w.Requests; i++ {
			id := fmt.Sprintf("rag-%05d", i)
			topic := topics.draw(rng)
			var picked []int
			for len(picked) < min(w.K, w.Docs) {
				if d := docs.draw(rng); !slices.Contains(picked, d) {
					picked = append(picked, d)
				}
			}
			slices.Sort(picked)
			segs := []Segment{sys}
			for _, d := range picked {
				segs = append(segs, Segment{Name: fmt.Sprintf("rag-t%d-d%d", topic, d), Len: w.DocLen})
			}
			segs = append(segs, Segment{Name: fmt.Sprintf("%s-s%d-q", id, seed), Len: w.QuestionLen})
			t.Requests = append(t.Requests, Request{ID: id, Arrival: arrive(), Output: w.OutputLen, Segments: segs})
		}
	case W5:
		for i := 0; i < w.Requests; i++ {
			id := fmt.Sprintf("w5-%05d", i)
			t.Requests = append(t.Requests, Request{
				ID: id, Arrival: arrive(), Output: w.OutputLen,
				Segments: []Segment{{Name: fmt.Sprintf("%s-s%d", id, seed), Len: w.PromptLen}},
			})
		}
	}
	return t
}

// zipf draws ranks 0..n-1 with P(k) ∝ (k+1)^-alpha.
type zipf struct{ cum []float64 }

func newZipf(n int, alpha float64) *zipf {
	z := &zipf{cum: make([]float64, n)}
	s := 0.0
	for k := 0; k < n; k++ {
		s += math.Pow(float64(k+1), -alpha)
		z.cum[k] = s
	}
	for k := range z.cum {
		z.cum[k] /= s
	}
	return z
}

func (z *zipf) draw(rng *rand.Rand) int {
	u := rng.Float64()
	return min(sort.SearchFloat64s(z.cum, u), len(z.cum)-1)
}
