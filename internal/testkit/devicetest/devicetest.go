// Package devicetest picks the device that tests of the manager and of what
// is built on it run on, so that one test binary runs on the emulation here
// and on a GPU elsewhere:
//
//	go test ./core                     the emulated device (the default)
//	KVCM_DEVICE=cuda ./core.test       the same tests on the CUDA backend
//
// The name comes from the KVCM_DEVICE environment variable (emu, cuda or
// auto, as backend.Open reads it) and defaults to emu, not auto: tests stay
// on the emulation, which has delays and fault injection, unless a run asks
// for a GPU. Tests that need features only the emulation has (emu.Device's
// FailNext, Stats or MaxDelay, or host functions that submit device work)
// skip on CUDA with SkipUnlessEmu, giving the reason.
package devicetest

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/device/emu"
)

// Name is the backend name tests ask backend.Open for: KVCM_DEVICE, or "emu"
// when it is unset or empty.
func Name() string {
	n := strings.ToLower(strings.TrimSpace(os.Getenv(backend.EnvVar)))
	if n == "" {
		return backend.Emu
	}
	return n
}

// Resolved is the concrete backend Name selects ("emu" or "cuda"), or an
// error for an unknown name.
func Resolved() (string, error) { return backend.Resolve(Name()) }

var anchor struct {
	once sync.Once
	dev  device.Device
	err  error
}

// Open opens a new device of the selected backend through backend.OpenWith;
// emuOpts apply when that is the emulation. The caller closes it. It fails
// the test when the backend cannot be opened: a run that asks for cuda where
// there is none is an error, not a skip.
//
// On CUDA the first call also opens one device that stays open for the rest
// of the process, so that the primary context stays retained and each test's
// own device is cheap to open and close.
func Open(t testing.TB, emuOpts emu.Options) device.Device {
	t.Helper()
	name, err := Resolved()
	if err != nil {
		t.Fatalf("devicetest: %s=%q: %v", backend.EnvVar, os.Getenv(backend.EnvVar), err)
	}
	if name == backend.CUDA {
		anchor.once.Do(func() { anchor.dev, anchor.err = backend.Open(backend.CUDA) })
		if anchor.err != nil {
			t.Fatalf("devicetest: %s=%s: %v", backend.EnvVar, Name(), anchor.err)
		}
	}
	d, err := backend.OpenWith(name, backend.Options{Emu: emuOpts})
	if err != nil {
		t.Fatalf("devicetest: %s=%s: %v", backend.EnvVar, Name(), err)
	}
	return d
}

// IsEmu reports whether d is the emulated device.
func IsEmu(d device.Device) bool { return d.Name() == backend.Emu }

// SkipUnlessEmu skips the test when d is not the emulated device, saying
// why the test needs the emulation.
func SkipUnlessEmu(t testing.TB, d device.Device, why string) {
	t.Helper()
	if !IsEmu(d) {
		t.Skipf("needs the emulated device (%s); running on %s", why, d.Name())
	}
}
