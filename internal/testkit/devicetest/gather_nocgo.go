//go:build !cgo

package devicetest

import (
	"errors"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
)

func newGather(device.Device) (codec.ColdPageCodec, error) {
	return nil, errors.New("the gather codec needs cgo")
}
