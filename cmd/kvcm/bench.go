package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/kvcm/kvcm/core/bench/migrate"
)

var benchCommand = command{
	name:    "bench",
	summary: "benchmarks: kvcm bench migrate [flags]",
	synopsis: `kvcm bench migrate measures, per codec and chunk size, encode and decode
throughput of scattered pages between device pools and pinned host memory,
next to the contiguous-copy limit measured in the same process, their ratio
and the host submit cost; every copied byte is verified before timing. It runs
on a CUDA GPU when there is one (the default, gather and FP8 codecs) and on the
emulated device otherwise (the default codec). Run kvcm bench migrate -h for
its flags.`,
	setup: func(*flag.FlagSet) func(stdout, stderr io.Writer) int { return nil },
	main:  benchMain,
}

func benchMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "migrate" {
		fmt.Fprintln(stderr, "usage: kvcm bench migrate [flags]")
		return exitUsage
	}
	return migrate.Main(args[1:], stdout, stderr)
}
