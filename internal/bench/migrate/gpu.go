//go:build cgo

package migrate

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/codec/staged"
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

// runDuplexOnGPU is duplex mode on CUDA device ordinal: default and gather
// codecs as in Run, staged over the gather kernel.
func runDuplexOnGPU(ordinal int, cfg Config, stage staged.Options, log io.Writer) ([]DuplexResult, string, error) {
	if err := cfg.fill(); err != nil {
		return nil, "", err
	}
	dev, err := cuda.New(cuda.Options{Ordinal: ordinal})
	if err != nil {
		return nil, "", err
	}
	p := dev.Properties()
	header := fmt.Sprintf("kvcm bench migrate -duplex: %s (sm_%d%d, %d SMs), driver %d.%d, %v; %d MiB down and %d MiB up per run, median of %d runs, wall clock; %s",
		p.Name, p.ComputeMajor, p.ComputeMinor, p.Multiprocessors, p.DriverVersion/1000, p.DriverVersion%1000/10, p.BatchMode,
		cfg.TotalBytes>>20, cfg.DuplexUpBytes>>20, cfg.Runs, describeStaging(stage))
	mk := func(name string) (codec.ColdPageCodec, error) {
		kernel, isGather := strings.CutPrefix(name, Gather+":")
		if !isGather {
			kernel = "" // the default variant
		}
		switch {
		case name == Default:
			return codec.NewDefault(), nil
		case name == Gather || isGather:
			return gpucodec.NewGatherWith(dev, gpucodec.GatherOptions{Kernel: kernel})
		case name == Staged:
			g, err := gpucodec.NewGather(dev)
			if err != nil {
				return nil, err
			}
			return staged.New(dev, g, stage)
		}
		return nil, fmt.Errorf("duplex mode runs lossless codecs (%s, %s, %s), not %q", Default, Gather, Staged, name)
	}
	res, err := RunDuplex(dev, cfg, mk, log)
	return res, header, errors.Join(err, dev.Close())
}
