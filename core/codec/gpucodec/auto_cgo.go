//go:build cgo

package gpucodec

import (
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
)

func init() {
	newKernelFor = func(dev device.Device, variant string) (codec.ColdPageCodec, error) {
		cd, ok := dev.(*cuda.Device)
		if !ok {
			return nil, nil
		}
		g, err := NewGatherWith(cd, GatherOptions{Kernel: variant})
		if err != nil {
			return nil, err
		}
		return g, nil
	}
	newKernelSpec = func(dev device.Device, s Spec) (codec.ColdPageCodec, error) {
		cd, ok := dev.(*cuda.Device)
		if !ok {
			return nil, nil
		}
		if s.Kind == KindFP8 {
			return NewQuant(cd, QuantOptions{Format: s.Format, BlockElems: s.BlockElems})
		}
		return NewGather(cd)
	}
}
