//go:build cgo

package migrate

import (
	"errors"
	"fmt"
	"io"

	"github.com/kvcm/kvcm/core/device/cuda"
)

func runOnGPU(ordinal int, cfg Config, log io.Writer) ([]Result, string, error) {
	if err := cfg.fill(); err != nil {
		return nil, "", err
	}
	dev, err := cuda.New(cuda.Options{Ordinal: ordinal})
	if err != nil {
		return nil, "", err
	}
	p := dev.Properties()
	header := fmt.Sprintf("kvcm bench migrate: %s (sm_%d%d, %d SMs), driver %d.%d, %v; %d MiB per run, median of %d runs, CUDA events",
		p.Name, p.ComputeMajor, p.ComputeMinor, p.Multiprocessors, p.DriverVersion/1000, p.DriverVersion%1000/10, p.BatchMode,
		cfg.TotalBytes>>20, cfg.Runs)
	res, err := Run(dev, cfg, log)
	return res, header, errors.Join(err, dev.Close())
}
