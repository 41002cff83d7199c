package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/kvcm/kvcm/internal/bench/bookkeeping"
	"github.com/kvcm/kvcm/internal/bench/disk"
	"github.com/kvcm/kvcm/internal/bench/migrate"
	"github.com/kvcm/kvcm/internal/bench/shared"
)

var benchCommand = command{
	name:    "bench",
	summary: "benchmarks: kvcm bench migrate|bookkeeping|disk|shared [flags]",
	synopsis: `kvcm bench migrate measures, per codec and chunk size, encode and decode
throughput of scattered pages between device pools and pinned host memory,
next to the contiguous-copy limit measured in the same process, their ratio
and the host submit cost; every copied byte is verified before timing. It runs
on a CUDA GPU when there is one (the default, gather and FP8 codecs) and on the
emulated device otherwise (the default codec). With -duplex it moves pages down
and up at once on two streams and prints the aggregate beside the two-stream
contiguous DMA limit (and each direction alone beside its own), for the
default, gather and staged codecs. Run kvcm bench migrate -h for its flags.

kvcm bench bookkeeping runs the manager's bookkeeping trace (prompts of 1k, 8k
and 32k tokens, every other request sharing half its prompt with the one
before, 128 decode steps each, with and without eviction pressure, with the
SHA-256 and the XXH3 block key) on the emulated device and prints CPU time and
allocations per request, the ratio to the SHA-256 hashing of the same prompts'
blocks, and the decode-step cost at
1k and 128k tokens held. Run kvcm bench bookkeeping -h for its flags.

kvcm bench disk measures, per blob size (16 KiB to 2 MiB), the disk tier's
GPU→disk (durable, fsync included) and disk→GPU (page cache dropped)
throughput next to the raw O_DIRECT bandwidth of the same directory at the
same block size and queue depth, sequential and random, measured in the same
run (medians of -reps runs, the tier's and the raw ones interleaved), and
their ratios. Run kvcm bench disk -h for its flags.

kvcm bench shared measures the shared tier (core/sharedtier) on a Redis
Cluster (-addrs, or $KVCM_REDIS_CLUSTER; scripts/redis-cluster.sh start runs
one on loopback): the store's write and lookup+read GB/s per value size beside
the cluster's raw pipelined SET and GET GB/s measured in the same run, and a
second manager's onboarding of blocks a first wrote through (create and resume,
decoded to the GPU) beside a raw GET of the same blobs, with their ratios. Run
kvcm bench shared -h for its flags.`,
	setup: func(*flag.FlagSet) func(stdout, stderr io.Writer) int { return nil },
	main:  benchMain,
}

func benchMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "migrate":
			return migrate.Main(args[1:], stdout, stderr)
		case "bookkeeping":
			return bookkeeping.Main(args[1:], stdout, stderr)
		case "disk":
			return disk.Main(args[1:], stdout, stderr)
		case "shared":
			return shared.Main(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintln(stderr, "usage: kvcm bench migrate|bookkeeping|disk|shared [flags]")
	return exitUsage
}
