package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/kvcm/kvcm/internal/sim"
)

var simulateCommand = command{
	name:    "simulate",
	summary: "simulate serving with CP-aware admission policies over the real manager",
	synopsis: `Runs the discrete-event serving simulator of internal/sim (continuous batching,
chunked prefill, a token budget, the cost model of EVALUATION.md §3) over
the real kvcm manager, for every workload × policy × load × seed. Loads are
fractions of each workload's FCFS saturation throughput. Prints a table per
workload (TTFT mean/p50/p90/p99 split into queueing and prefill, token hit
ratio, computed prefill tokens, evictions, worst wait and bypass, scheduler
time per step, and the paired gain against FCFS with 95% confidence
intervals over seeds), or JSON with --json; --plots writes charts (SVG, or
PDF or PNG with --plot-format). Loads are defined once for generated and
replayed traces: --write-trace writes a workload's traces, --trace replays
them (several files, one a seed) at exactly the same loads.

The default run takes a minute or two; --full runs the matrix of
docs/scheduling.md's first study, --grid tiers the grid over the host and
disk tiers (issue 18). Simulations run in parallel, one per CPU unless
-j (--workers) says otherwise, longest first.`,
	setup: setupSimulate,
}

func setupSimulate(fs *flag.FlagSet) func(stdout, stderr io.Writer) int {
	var c sim.CLI
	c.Register(fs)
	mode := fs.String("progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), always or never")
	return func(stdout, stderr io.Writer) int {
		if *mode != "auto" && *mode != "always" && *mode != "never" {
			fmt.Fprintf(stderr, "kvcm simulate: --progress must be auto, always or never, got %q\n", *mode)
			return exitUsage
		}
		show := *mode == "always" || (*mode == "auto" && isTerminal(stderr))
		var bar *progress
		err := c.Run(stdout, stderr, func(done, total int) {
			if bar == nil {
				bar = newProgress(stderr, show, "simulate", "runs", total)
			}
			bar.set(done)
		})
		if bar != nil {
			bar.finish()
		}
		if err != nil {
			fmt.Fprintln(stderr, "kvcm simulate:", err)
			return exitFail
		}
		return exitOK
	}
}
