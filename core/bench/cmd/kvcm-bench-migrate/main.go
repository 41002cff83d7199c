// Command kvcm-bench-migrate runs the migration-throughput benchmark
// (core/bench/migrate) on a CUDA GPU; `kvcm bench migrate` runs the same.
package main

import (
	"os"

	"github.com/kvcm/kvcm/core/bench/migrate"
)

func main() { os.Exit(migrate.Main(os.Args[1:], os.Stdout, os.Stderr)) }
