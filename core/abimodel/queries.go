package abimodel

import (
	"math"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// The manager's and cache's queries in the form the C ABI calls them:
// stream handles rather than streams, the ABI's integer widths.

// NumLevels is the number of cache levels (configured tiers).
func (mgr *Manager) NumLevels() int { return len(mgr.m.Layout().Levels) }

// NumOpenCaches is how many caches of the manager are open; it fails with
// core.ErrClosed once the manager is closed.
func (mgr *Manager) NumOpenCaches() (int, error) {
	if err := mgr.open(); err != nil {
		return 0, err
	}
	return mgr.m.NumOpenCaches(), nil
}

// PageStride is the bytes between consecutive kernel page indices of a
// layer's buffer (see core.BufferLocation.PageStride).
func (mgr *Manager) PageStride(layer int32, role config.DataRole) (int64, error) {
	loc, err := mgr.m.Buffer(layer, role)
	if err != nil {
		return 0, err
	}
	return loc.PageStride(), nil
}

// ScratchPagesPerBlock is the sub-pages a scratch block of a layer's buffer
// takes (see core.BufferLocation).
func (mgr *Manager) ScratchPagesPerBlock(layer int32, role config.DataRole) (int64, error) {
	loc, err := mgr.m.Buffer(layer, role)
	if err != nil {
		return 0, err
	}
	return loc.ScratchPagesPerBlock, nil
}

// ClampMaxSeqLenForMem is core.Manager.ClampMaxSeqLenForMem for 64-bit
// arguments: a batch size above math.MaxInt32 is an error naming
// batch_size.
func (mgr *Manager) ClampMaxSeqLenForMem(batchSize, upperBound int64) (int, error) {
	if batchSize > math.MaxInt32 {
		return 0, argErr("batch_size", "%d is out of range (at most %d)", batchSize, math.MaxInt32)
	}
	return mgr.m.ClampMaxSeqLenForMem(int(batchSize), int(upperBound))
}

// CreateStreamHandle is CreateStream returning the stream's native handle.
func (mgr *Manager) CreateStreamHandle() (uintptr, error) {
	s, err := mgr.CreateStream()
	if err != nil {
		return 0, err
	}
	return s.Handle(), nil
}

// ResumeOn is Resume on the stream of native handle h, a live stream of the
// manager's device.
func (c *Cache) ResumeOn(h uintptr) error {
	s, err := c.mgr.Stream(h)
	if err != nil {
		return err
	}
	return c.Resume(s)
}

// WaitFreshTailOn is WaitFreshTail on the stream of native handle h, a
// live stream of the manager's device.
func (c *Cache) WaitFreshTailOn(h uintptr) error {
	s, err := c.mgr.Stream(h)
	if err != nil {
		return err
	}
	return c.c.WaitFreshTail(s)
}

// SetStreamOf is SetStream to the stream of native handle h, a live stream
// of the manager's device.
func (c *Cache) SetStreamOf(h uintptr) error {
	s, err := c.mgr.Stream(h)
	if err != nil {
		return err
	}
	return c.SetStream(s)
}

// Synchronize synchronizes the stream of native handle h on a registered
// device.
func (r *DeviceRegistry) Synchronize(h uintptr) error {
	s, err := r.Stream(h)
	if err != nil {
		return err
	}
	return s.Synchronize()
}

// BatchCopy enqueues descs as one submission on the stream of native handle
// h on a registered device.
func (r *DeviceRegistry) BatchCopy(h uintptr, descs []device.CopyDesc) error {
	s, err := r.Stream(h)
	if err != nil {
		return err
	}
	return s.BatchCopy(descs)
}

// ValidateConfig resolves an ABI manager configuration and validates it
// (Validate) without creating a manager.
func ValidateConfig(mc ManagerConfig) error {
	cfg, opts, err := mc.Resolve()
	if err != nil {
		return err
	}
	return Validate(cfg, opts)
}

// BlockKeys is blockhash.ChainDigests for the ABI's digests (positions and
// bytes, see Digests): the keys of a sequence's blocks, a trailing partial
// block's too when partial. Bad input is an invalid argument.
func BlockKeys(algo blockhash.Algorithm, scope blockhash.Scope, tokensPerBlock int32, tokens []config.Token, positions []uint64, digestBytes string, partial bool) ([]blockhash.Key, error) {
	ds, err := Digests(positions, digestBytes, "digest_positions")
	if err != nil {
		return nil, err
	}
	ks, err := blockhash.ChainDigests(algo, scope, int(tokensPerBlock), tokens, ds, partial)
	if err != nil {
		return nil, argErr("block_keys", "%v", err)
	}
	return ks, nil
}

// CommitDigestBytes is CommitDigests for the ABI's digests (positions and
// bytes, see Digests).
func (c *Cache) CommitDigestBytes(tokens []config.Token, positions []uint64, digestBytes string, isEnd bool) error {
	ds, err := Digests(positions, digestBytes, "digest_positions")
	if err != nil {
		return err
	}
	return c.CommitDigests(tokens, ds, isEnd)
}

// ScratchDesc is core.KVCache.ScratchDesc as the ABI returns it: the
// scratch blocks' range and their slots.
func (c *Cache) ScratchDesc(lg layout.LayerGroupID) (begin, end int, slots []int32, err error) {
	d, err := c.c.ScratchDesc(lg)
	return d.Begin, d.End, d.Slots, err
}

// HostFunc enqueues fn on the stream of native handle h on a registered
// device (see device.Stream.HostFunc).
func (r *DeviceRegistry) HostFunc(h uintptr, fn func() error) error {
	s, err := r.Stream(h)
	if err != nil {
		return err
	}
	return s.HostFunc(fn)
}

// CopyFromHost enqueues a copy of src into dst on the stream of native
// handle h on a registered device; src is consumed before it returns.
func (r *DeviceRegistry) CopyFromHost(h uintptr, dst device.Ptr, src []byte) error {
	s, err := r.Stream(h)
	if err != nil || len(src) == 0 {
		return err
	}
	return s.CopyFromHost(dst, src)
}
