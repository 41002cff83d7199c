package devicetest

import (
	"fmt"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// DeviceIndexCodec returns a lossless codec with Device-located indices in
// the default codec's cold format, for tests of the manager's device index
// ring, and a function returning the pair count of every accepted Encode and
// Decode call in call order. On the emulated device it is
// codectest.DeviceIndexed; on CUDA, where a host function must not submit
// device work as DeviceIndexed's does, it is the gather kernel codec
// (gpucodec.Gather) behind a counting codectest.Faulty.
func DeviceIndexCodec(d device.Device) (codec.ColdPageCodec, func() []int, error) {
	if IsEmu(d) {
		di := codectest.NewDeviceIndexed(d)
		return di, di.PairsPerCall, nil
	}
	g, err := newGather(d)
	if err != nil {
		return nil, nil, fmt.Errorf("devicetest: device-index codec on %s: %w", d.Name(), err)
	}
	f := codectest.NewFaulty(g)
	return f, func() []int {
		var out []int
		for _, c := range f.Calls() {
			if c.OK {
				out = append(out, c.Pairs)
			}
		}
		return out
	}, nil
}
