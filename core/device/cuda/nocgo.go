//go:build !cgo

package cuda

import (
	"fmt"

	"github.com/kvcm/kvcm/core/device"
)

// Available reports whether a CUDA driver and at least one GPU can be used:
// never without cgo.
func Available() bool { return false }

// OpenDevice fails without cgo: the backend needs it to load the driver.
func OpenDevice(opts Options) (device.Device, error) {
	return nil, fmt.Errorf("%w: kvcm was built without cgo (CGO_ENABLED=0)", ErrUnavailable)
}
