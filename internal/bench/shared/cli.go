package shared

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Main is `kvcm bench shared`.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench shared", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addrs := fs.String("addrs", os.Getenv("KVCM_REDIS_CLUSTER"), "cluster seed addresses, comma-separated (default $KVCM_REDIS_CLUSTER)")
	sizes := fs.String("sizes", "16k,256k,2m", "value sizes (k = KiB, m = MiB)")
	mib := fs.Int64("mib", 64, "MiB written and read per size and round")
	batch := fs.Int("batch", 32, "keys per pipelined round trip")
	writers := fs.Int("writers", 2, "write goroutines (the store's writers and the raw SET's)")
	rounds := fs.Int("rounds", 5, "interleaved rounds (medians reported)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := Config{Bytes: *mib << 20, Batch: *batch, Writers: *writers, Rounds: *rounds}
	if *addrs != "" {
		cfg.Addresses = strings.Split(*addrs, ",")
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := parseSize(s)
		if err != nil {
			fmt.Fprintln(stderr, "bench shared: -sizes:", err)
			return 2
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	rows, err := Run(context.Background(), cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	Print(stdout, cfg, rows)
	return 0
}

func parseSize(s string) (int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1
	switch {
	case strings.HasSuffix(t, "k"):
		mult, t = 1<<10, strings.TrimSuffix(t, "k")
	case strings.HasSuffix(t, "m"):
		mult, t = 1<<20, strings.TrimSuffix(t, "m")
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 || n > (512<<20)/mult {
		return 0, fmt.Errorf("invalid size %q (want a positive count of bytes, k or m, up to 512m)", s)
	}
	return n * mult, nil
}
