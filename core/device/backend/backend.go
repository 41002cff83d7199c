// Package backend chooses the device.Device implementation by name, so that
// configuration (a flag, an environment variable, a config field) selects
// the accelerator backend without code changes:
//
//	"emu"   the host emulation (core/device/emu), always available
//	"cuda"  the CUDA driver backend (core/device/cuda); fails where there is
//	        no driver or GPU (the error wraps cuda.ErrUnavailable)
//	"auto"  cuda when a CUDA driver and at least one GPU are present, emu
//	        otherwise; a GPU that is present but fails to open is an error,
//	        not a silent fallback
//	""      the value of the KVCM_DEVICE environment variable, or "auto" when
//	        it is unset or empty
//
// Names are case-insensitive. Open(name) uses default options of each
// backend; OpenWith takes them explicitly.
package backend

import (
	"fmt"
	"os"
	"strings"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/core/device/emu"
)

// EnvVar names the environment variable Open("") reads.
const EnvVar = "KVCM_DEVICE"

// Backend names.
const (
	Emu  = "emu"
	CUDA = "cuda"
	Auto = "auto"
)

// Names lists the names Open accepts (besides "").
func Names() []string { return []string{Auto, CUDA, Emu} }

// Options carry each backend's options for OpenWith.
type Options struct {
	Emu  emu.Options
	CUDA cuda.Options
}

// Open returns a new device of the named backend with default options.
func Open(name string) (device.Device, error) { return OpenWith(name, Options{}) }

// OpenWith returns a new device of the named backend.
func OpenWith(name string, opts Options) (device.Device, error) {
	n, err := Resolve(name)
	if err != nil {
		return nil, err
	}
	switch n {
	case Emu:
		return emu.New(opts.Emu), nil
	case CUDA:
		return cuda.OpenDevice(opts.CUDA)
	}
	panic("unreachable")
}

// Resolve maps a name to the concrete backend Open would use: "emu" or
// "cuda". For "auto" (and "" without KVCM_DEVICE) it probes for a GPU.
func Resolve(name string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if n == "" {
		n = strings.ToLower(strings.TrimSpace(os.Getenv(EnvVar)))
		if n == "" {
			n = Auto
		}
	}
	switch n {
	case Emu, CUDA:
		return n, nil
	case Auto:
		if cuda.Available() {
			return CUDA, nil
		}
		return Emu, nil
	}
	return "", fmt.Errorf("device backend %q: unknown (want one of %s)", name, strings.Join(Names(), ", "))
}
