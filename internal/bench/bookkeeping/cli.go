package bookkeeping

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/internal/bench/cpuprofile"
)

// Main is `kvcm bench bookkeeping`: it parses args, runs the benchmark and
// prints its tables. It returns the process exit code.
//
//	-prompts LIST   prompt sizes in tokens, k = 1024 (default 1k,8k,32k)
//	-requests N     requests per round, size and pressure (default 32)
//	-rounds N       interleaved rounds, medians reported (default 5)
//	-steps N        decode steps per request (default 128)
//	-held LIST      cache sizes of the decode-step table (default 1k,128k)
//	-window N       sliding window of the windowed model, tokens (default 1k)
//	-keys LIST      block keys the trace runs with (default sha256,xxh3)
//	-forms LIST     decode step forms, the first the reference of the ratios:
//	                percall (Resize and Commit), steps1 (DecodeSteps of one
//	                token), block (one DecodeSteps a block) (default all)
//	-cpuprofile F   write a CPU profile of the whole run to F (go tool pprof)
func Main(args []string, stdout, stderr io.Writer) int {
	def := DefaultConfig()
	fs := flag.NewFlagSet("bench bookkeeping", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prompts := fs.String("prompts", "1k,8k,32k", "prompt sizes in tokens (k = 1024)")
	requests := fs.Int("requests", def.Requests, "requests per round, prompt size and pressure")
	rounds := fs.Int("rounds", def.Rounds, "interleaved rounds (medians reported)")
	steps := fs.Int("steps", def.DecodeSteps, "decode steps per request")
	held := fs.String("held", "1k,128k", "cache sizes of the decode-step table, tokens")
	window := fs.String("window", "1k", "sliding window of the windowed model, tokens")
	keys := fs.String("keys", "sha256,xxh3", "block keys the trace runs with (sha256, xxh3)")
	forms := fs.String("forms", "percall,steps1,block", "decode step forms (percall, steps1, block); the first is the reference")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := Config{Requests: *requests, Rounds: *rounds, DecodeSteps: *steps}
	var err error
	if cfg.Prompts, err = parseSizes(*prompts); err != nil {
		fmt.Fprintln(stderr, "bench bookkeeping: -prompts:", err)
		return 2
	}
	if cfg.HeldTokens, err = parseSizes(*held); err != nil {
		fmt.Fprintln(stderr, "bench bookkeeping: -held:", err)
		return 2
	}
	if cfg.Window, err = parseTokens(*window); err != nil {
		fmt.Fprintln(stderr, "bench bookkeeping: -window:", err)
		return 2
	}
	if cfg.BlockKeys, err = parseKeys(*keys); err != nil {
		fmt.Fprintln(stderr, "bench bookkeeping: -keys:", err)
		return 2
	}
	if cfg.Forms, err = parseForms(*forms); err != nil {
		fmt.Fprintln(stderr, "bench bookkeeping: -forms:", err)
		return 2
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	stop, err := cpuprofile.Start(*profile)
	if err != nil {
		fmt.Fprintln(stderr, "bench bookkeeping:", err)
		return 2
	}
	defer stop()
	res, err := Run(cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bench bookkeeping:", err)
		return 1
	}
	fmt.Fprintf(stdout, "Trace: %d requests a round per size and pressure, every other one sharing half its prompt with the one before; %d decode steps each; %d tokens a block; process CPU time, median of %d rounds.\n\n",
		cfg.Requests, cfg.DecodeSteps, tokensPerBlock, cfg.Rounds)
	WriteRequests(stdout, res.Requests)
	fmt.Fprintln(stdout)
	WriteSteps(stdout, res.Steps)
	return 0
}

// WriteRequests prints the trace's figures as a Markdown table, with each
// decode step form's request time over the reference form's (the first of
// each prompt, pressure and key) measured in the same run.
func WriteRequests(w io.Writer, rs []RequestResult) {
	fmt.Fprintln(w, "| prompt | eviction | block key | decode steps | µs / request | ÷ first form | allocs / request | SHA-256 of the prompt's blocks, µs | request / SHA-256 hashing | reused tokens | evictions / request | GC share of CPU | allocs / new block |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	var base time.Duration
	for i, r := range rs {
		if i == 0 || rs[i-1].Prompt != r.Prompt || rs[i-1].Pressure != r.Pressure || rs[i-1].Key != r.Key {
			base = r.RequestCPU
		}
		fmt.Fprintf(w, "| %s | %v | %v | %v | %.1f | %.2f | %.1f | %.1f | %.2f | %.0f | %.1f | %.2f | %.2f |\n",
			tokens(r.Prompt), r.Pressure, r.Key, r.Form, us(r.RequestCPU), float64(r.RequestCPU)/float64(base), r.Allocs,
			us(r.HashCPU), r.Ratio(), r.Reused, r.Evictions, r.GCShare, r.AllocsPerNewBlock())
	}
}

// WriteSteps prints the decode-step table, with each model's ratio of the
// step at its largest cache size to the step at its smallest.
func WriteSteps(w io.Writer, ss []StepResult) {
	fmt.Fprintln(w, "| model | decode steps | tokens held | ns / decode step | allocs / step | step / step at the smallest size |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	var base time.Duration
	for i, s := range ss {
		if i == 0 || ss[i-1].Model != s.Model || ss[i-1].Form != s.Form {
			base = s.Step
		}
		fmt.Fprintf(w, "| %s | %v | %s | %.0f | %.3f | %.2f |\n",
			s.Model, s.Form, tokens(s.Held), float64(s.Step.Nanoseconds()), s.Allocs, float64(s.Step)/float64(base))
	}
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func tokens(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%dk", n/1024)
	}
	return strconv.Itoa(n)
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := parseTokens(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func parseKeys(s string) ([]blockhash.Algorithm, error) {
	var out []blockhash.Algorithm
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "sha256":
			out = append(out, blockhash.SHA256)
		case "xxh3":
			out = append(out, blockhash.XXH3)
		default:
			return nil, fmt.Errorf("%q is not a block key (sha256, xxh3)", f)
		}
	}
	return out, nil
}

func parseForms(s string) ([]StepForm, error) {
	var out []StepForm
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "percall":
			out = append(out, PerStep)
		case "steps1":
			out = append(out, OneCallPerStep)
		case "block":
			out = append(out, OneCallPerBlock)
		default:
			return nil, fmt.Errorf("%q is not a decode step form (percall, steps1, block)", f)
		}
	}
	return out, nil
}

// parseTokens reads a token count, with an optional k suffix (×1024).
func parseTokens(s string) (int, error) {
	s = strings.TrimSpace(s)
	mul := 1
	if t, ok := strings.CutSuffix(s, "k"); ok {
		s, mul = t, 1024
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive token count", s)
	}
	return n * mul, nil
}
