//go:build cgo

package devicetest

import (
	"fmt"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
)

func newGather(d device.Device) (codec.ColdPageCodec, error) {
	cd, ok := d.(*cuda.Device)
	if !ok {
		return nil, fmt.Errorf("not a CUDA device (%T)", d)
	}
	return gpucodec.NewGather(cd)
}
