package abimodel

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/device"
)

// CreateStream creates a stream on the manager's device. DestroyStream or
// Close destroys it.
func (mgr *Manager) CreateStream() (device.Stream, error) {
	mgr.smu.Lock()
	defer mgr.smu.Unlock()
	if mgr.closed.Load() {
		return nil, destroyedErr("manager is being destroyed")
	}
	s, err := mgr.dev.NewStream()
	if err != nil {
		return nil, err
	}
	mgr.streams[s.Handle()] = s
	return s, nil
}

// DestroyStream synchronizes and destroys a stream CreateStream returned. It
// fails with core.ErrInvalidState, naming the cache and changing nothing,
// while an ACTIVE cache of the manager uses the stream: suspend or close the
// cache first.
func (mgr *Manager) DestroyStream(h uintptr) error {
	mgr.smu.Lock()
	s, ok := mgr.streams[h]
	if !ok {
		mgr.smu.Unlock()
		return argErr("stream", "%#x was not created by this manager or was already destroyed", h)
	}
	if mgr.resuming[h] > 0 {
		mgr.smu.Unlock()
		return fmt.Errorf("%w: stream %#x: a cache is resuming on it", core.ErrInvalidState, h)
	}
	if id, used := mgr.activeOn(h); used {
		mgr.smu.Unlock()
		return fmt.Errorf("%w: stream %#x is used by ACTIVE cache %d: suspend or close the cache first", core.ErrInvalidState, h, id)
	}
	delete(mgr.streams, h)
	mgr.retiring[h] = true
	mgr.smu.Unlock()
	err := s.Synchronize()
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	mgr.smu.Lock()
	delete(mgr.retiring, h)
	mgr.smu.Unlock()
	return err
}

// activeOn reports the lowest id of an ACTIVE cache on stream h.
func (mgr *Manager) activeOn(h uintptr) (uint64, bool) {
	mgr.mu.Lock()
	var ids []uint64
	for c := range mgr.caches {
		if s := c.c.Stream(); s != nil && s.Handle() == h {
			ids = append(ids, c.c.ID())
		}
	}
	mgr.mu.Unlock()
	if len(ids) == 0 {
		return 0, false
	}
	return slices.Min(ids), true
}

// Stream resolves a native stream handle on the manager's device: one
// CreateStream returned, or one the engine owns, which the device adopts (see
// device.Device.AdoptStream: on CUDA a CUstream of the device's context, 0
// the legacy default stream included; on the emulation any value names an
// emulated stream of its own).
func (mgr *Manager) Stream(h uintptr) (device.Stream, error) {
	s, err := mgr.dev.StreamFromHandle(h)
	if errors.Is(err, device.ErrUnknownStream) {
		s, err = mgr.dev.AdoptStream(h)
	}
	if err != nil {
		return nil, argErr("stream", "%#x is not a stream of the manager's device: %v", h, err)
	}
	return s, nil
}
