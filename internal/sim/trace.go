// Package sim is a discrete-event simulator of LLM serving with continuous
// batching and chunked prefill, over the real kvcm manager: every request's
// KV cache is a core.KVCache (tiny buffers, so millions of tokens fit),
// reuse, eviction and block bookkeeping are the manager's own, and blocks
// that finished requests leave behind stay cached until evicted. Compute
// time comes from a documented cost model (CostModel), moves between the
// GPU and the manager's host and disk levels (Tiers) from a link model
// (Link) that runs alongside compute. It measures admission policies
// (package sched), prefetch for waiting requests and queue-aware eviction
// against CP-aware indexes (package cp) on the workloads of EVALUATION.md
// §3.
package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"slices"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// Vocab is the size of the synthetic vocabulary tokens are drawn from.
const Vocab = 32000

// Segment is a named run of synthetic tokens. Equal names give equal tokens
// in every trace and run (see SegmentTokens), so shared prefixes are shared
// segments.
type Segment struct {
	Name string `json:"seg"`
	Len  int    `json:"len"`
}

// Request is one request of a trace, one JSONL line.
type Request struct {
	ID string `json:"id"`
	// Arrival is the arrival time in seconds. For a follow-up turn of a
	// session (Turn > 0) it is ignored: the turn arrives Think seconds after
	// the previous turn of its session finished (closed loop).
	Arrival float64 `json:"arrival"`
	Session string  `json:"session,omitempty"`
	Turn    int     `json:"turn,omitempty"`
	Think   float64 `json:"think,omitempty"`
	// The prompt: explicit Tokens if present, else the concatenated
	// Segments.
	Tokens   []config.Token `json:"tokens,omitempty"`
	Segments []Segment      `json:"segments,omitempty"`
	// Output is the number of tokens generated (at least 1). Their ids come
	// from the segment OutputSeg (default: ID + "/out"), so a later turn can
	// carry them in its prompt.
	Output    int    `json:"output"`
	OutputSeg string `json:"output_seg,omitempty"`
}

// PromptLen returns the prompt length in tokens.
func (r *Request) PromptLen() int {
	if r.Tokens != nil {
		return len(r.Tokens)
	}
	n := 0
	for _, s := range r.Segments {
		n += s.Len
	}
	return n
}

// PromptTokens materializes the prompt.
func (r *Request) PromptTokens() []config.Token {
	if r.Tokens != nil {
		return slices.Clone(r.Tokens)
	}
	out := make([]config.Token, 0, r.PromptLen()+r.Output)
	for _, s := range r.Segments {
		out = appendSegment(out, s.Name, s.Len)
	}
	return out
}

// OutputTokens materializes the generated tokens.
func (r *Request) OutputTokens() []config.Token {
	name := r.OutputSeg
	if name == "" {
		name = r.ID + "/out"
	}
	return SegmentTokens(name, r.Output)
}

// SegmentTokens returns the n tokens of the named segment: a deterministic
// pseudo-random sequence in [1, Vocab) seeded by the FNV-1a hash of the name.
func SegmentTokens(name string, n int) []config.Token {
	return appendSegment(make([]config.Token, 0, n), name, n)
}

func appendSegment(dst []config.Token, name string, n int) []config.Token {
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(h.Sum64(), 0x6b76636d))
	for i := 0; i < n; i++ {
		dst = append(dst, config.Token(1+rng.IntN(Vocab-1)))
	}
	return dst
}

// Trace is a list of requests. Open-loop requests are ordered by arrival;
// the turns of a session follow each other.
type Trace struct {
	Name     string
	Requests []Request
}

// Validate checks ids, lengths and session chains.
func (t *Trace) Validate() error {
	ids := make(map[string]bool, len(t.Requests))
	turns := map[string]map[int]bool{}
	for i, r := range t.Requests {
		switch {
		case r.ID == "":
			return fmt.Errorf("trace %s: request %d has no id", t.Name, i)
		case ids[r.ID]:
			return fmt.Errorf("trace %s: duplicate id %q", t.Name, r.ID)
		case r.PromptLen() < 1:
			return fmt.Errorf("trace %s: request %q has an empty prompt", t.Name, r.ID)
		case r.Output < 1:
			return fmt.Errorf("trace %s: request %q: output must be at least 1, got %d", t.Name, r.ID, r.Output)
		case r.Arrival < 0 || r.Think < 0:
			return fmt.Errorf("trace %s: request %q: negative time", t.Name, r.ID)
		case r.Turn > 0 && r.Session == "":
			return fmt.Errorf("trace %s: request %q: a follow-up turn needs a session", t.Name, r.ID)
		}
		ids[r.ID] = true
		if r.Session != "" {
			if turns[r.Session] == nil {
				turns[r.Session] = map[int]bool{}
			}
			if turns[r.Session][r.Turn] {
				return fmt.Errorf("trace %s: session %q has turn %d twice", t.Name, r.Session, r.Turn)
			}
			turns[r.Session][r.Turn] = true
		}
	}
	for _, r := range t.Requests {
		if r.Turn > 0 && !turns[r.Session][r.Turn-1] {
			return fmt.Errorf("trace %s: request %q: session %q has no turn %d before turn %d",
				t.Name, r.ID, r.Session, r.Turn-1, r.Turn)
		}
	}
	return nil
}

// TimeScaled returns a copy whose open-loop arrival times are multiplied by
// f (f < 1 compresses time: a higher arrival rate). Think times are a
// property of users and stay.
func (t *Trace) TimeScaled(f float64) *Trace {
	out := &Trace{Name: t.Name, Requests: slices.Clone(t.Requests)}
	for i := range out.Requests {
		out.Requests[i].Arrival *= f
	}
	return out
}

// Backlog returns a copy in which every request arrives at time 0 and
// follow-up turns arrive as soon as the previous one finished: the input for
// measuring saturation throughput.
func (t *Trace) Backlog() *Trace {
	out := &Trace{Name: t.Name, Requests: slices.Clone(t.Requests)}
	for i := range out.Requests {
		out.Requests[i].Arrival, out.Requests[i].Think = 0, 0
	}
	return out
}

// WriteJSONL writes one request per line.
func (t *Trace) WriteJSONL(w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range t.Requests {
		if err := enc.Encode(&t.Requests[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ReadJSONL reads a trace written by WriteJSONL (or by hand: one JSON
// request per line, blank lines ignored) and validates it.
func ReadJSONL(r io.Reader, name string) (*Trace, error) {
	t := &Trace{Name: name}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(slices.DeleteFunc(slices.Clone(b), func(c byte) bool { return c == ' ' || c == '\t' || c == '\r' })) == 0 {
			continue
		}
		var req Request
		if err := json.Unmarshal(b, &req); err != nil {
			return nil, fmt.Errorf("trace %s line %d: %w", name, line, err)
		}
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s: %w", name, err)
	}
	if len(t.Requests) == 0 {
		return nil, errors.New("trace " + name + ": no requests")
	}
	return t, t.Validate()
}

// SharedPrefixTokens measures a trace's footprint: the tokens of the
// distinct full blocks (of tokensPerBlock tokens) that begin the prompts of
// at least two requests, that is, every prompt prefix reuse could serve,
// each counted once.
func SharedPrefixTokens(t *Trace, tokensPerBlock int) int64 {
	if tokensPerBlock < 1 {
		return 0
	}
	seen := map[blockhash.Key]int{}
	var shared int64
	for i := range t.Requests {
		p := t.Requests[i].PromptTokens()
		for _, k := range blockhash.Chain(blockhash.Scope{}, tokensPerBlock, p[:len(p)/tokensPerBlock*tokensPerBlock]) {
			if seen[k]++; seen[k] == 2 {
				shared += int64(tokensPerBlock)
			}
		}
	}
	return shared
}
