//go:build !cgo

package migrate

import (
	"fmt"
	"io"

	"github.com/kvcm/kvcm/core/codec/staged"
	"github.com/kvcm/kvcm/core/device/cuda"
)

func runOnGPU(int, Config, io.Writer) ([]Result, string, error) {
	return nil, "", fmt.Errorf("%w: the benchmark needs cgo", cuda.ErrUnavailable)
}

func runDuplexOnGPU(int, Config, staged.Options, io.Writer) ([]DuplexResult, string, error) {
	return nil, "", fmt.Errorf("%w: the benchmark needs cgo", cuda.ErrUnavailable)
}
