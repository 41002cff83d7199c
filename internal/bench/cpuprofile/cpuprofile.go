// Package cpuprofile is the -cpuprofile flag of the kvcm bench commands: a
// CPU profile of the whole run, for go tool pprof.
package cpuprofile

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
)

// Start writes a CPU profile to path until the returned stop is called;
// with an empty path it profiles nothing and stop does nothing.
func Start(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(fmt.Errorf("-cpuprofile: %w", err), f.Close())
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
