package codectest

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// DeviceIndexed is the default concatenating cold format with Device-located
// indices, for tests of the manager's device index ring (lazy allocation,
// reuse, capacity pressure, 64 KiB chunking).
//
// A call validates synchronously what the host can see (configured, known
// lifecycle, Device indices, non-null pointers, a stream) and enqueues on the
// stream: one BatchCopy of the index array into a host-mapped scratch buffer,
// then one HostFunc that reads the pairs, validates them, performs the page
// copies (one descriptor per page and pool, one BatchCopy) on a private
// internal stream, waits for that stream and returns the scratch. The index
// array is therefore read only by work on the call's stream, before that
// work completes, as the Device contract requires. Invalid index values can
// only be seen by that work: they fail the stream asynchronously (errors
// wrapping codec.ErrBadIndex) and copy nothing.
//
// Host functions of different streams are serialized on the internal stream.
type DeviceIndexed struct {
	dev     device.Device
	scratch *scratchPool

	mu         sync.Mutex
	hot        *codec.HotLayout
	configured bool
	closed     bool
	internal   device.Stream

	execMu sync.Mutex // serializes host functions' use of internal

	statsMu sync.Mutex
	pairs   []int // pairs per accepted call, in order
}

var _ codec.ColdPageCodec = (*DeviceIndexed)(nil)

// NewDeviceIndexed returns a DeviceIndexed that allocates its scratch and
// internal stream from dev.
func NewDeviceIndexed(dev device.Device) *DeviceIndexed {
	return &DeviceIndexed{dev: dev, scratch: newScratchPool(dev)}
}

// Configure accepts a well-formed layout and creates the internal stream; a
// second call returns false.
func (d *DeviceIndexed) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.configured {
		return false
	}
	d.configured = true
	hl, err := codec.NewHotLayout(gpuDescs)
	if err != nil {
		return false
	}
	s, err := d.dev.NewStream()
	if err != nil {
		return false
	}
	d.hot, d.internal = hl, s
	return true
}

// QueryColdPageBytes is lg's hot page bytes (concatenation).
func (d *DeviceIndexed) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hot.PageBytes(lg)
}

// GetBatchingLayerGroupID is the identity for known lifecycles.
func (d *DeviceIndexed) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hot.GetBatchingLayerGroupID(lg)
}

// QueryPageIndexLocation is Device for known lifecycles.
func (d *DeviceIndexed) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.hot.Known(lg) {
		return codec.BadLocation
	}
	return codec.Device
}

// Encode enqueues the concatenating encode of the idx.Len() pairs at
// idx.DevicePtr().
func (d *DeviceIndexed) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return d.transfer(lg, codec.ToCold, dstBase, idx, stream)
}

// Decode enqueues the concatenating decode of the idx.Len() pairs at
// idx.DevicePtr().
func (d *DeviceIndexed) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return d.transfer(lg, codec.ToHot, srcBase, idx, stream)
}

func (d *DeviceIndexed) transfer(lg layout.LayerGroupID, dir codec.Direction, coldBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || !d.hot.Known(lg) || idx.Location() != codec.Device || idx.Len() < 0 {
		return false
	}
	n := idx.Len()
	if n == 0 {
		d.record(0)
		return true
	}
	if stream == nil || coldBase == 0 || idx.DevicePtr() == 0 {
		return false
	}
	size := int64(n) * codec.PageIndexPairBytes
	mem, err := d.scratch.get(size)
	if err != nil {
		return false
	}
	if stream.BatchCopy([]device.CopyDesc{{Dst: mem.Ptr(), Src: idx.DevicePtr(), Size: size}}) != nil {
		d.scratch.put(mem) // nothing enqueued
		return false
	}
	hot, internal, stride := d.hot, d.internal, d.hot.PageBytes(lg)
	work := func() error {
		defer d.scratch.put(mem)
		b := mem.Host()[:size]
		pairs := unsafe.Slice((*codec.PageIndexPair)(unsafe.Pointer(&b[0])), n)
		descs, err := hot.AppendConcatCopies(nil, lg, dir, coldBase, stride, pairs)
		if err != nil {
			return fmt.Errorf("codectest: device-indexed %v of lifecycle %d: %w", dir, lg, err)
		}
		d.execMu.Lock()
		defer d.execMu.Unlock()
		if err := internal.BatchCopy(descs); err != nil {
			return fmt.Errorf("codectest: device-indexed %v of lifecycle %d: %w", dir, lg, err)
		}
		return internal.Synchronize()
	}
	if stream.HostFunc(work) != nil {
		d.scratch.orphan(mem) // only the index copy into scratch was enqueued
		return false
	}
	d.record(n)
	return true
}

func (d *DeviceIndexed) record(n int) {
	d.statsMu.Lock()
	defer d.statsMu.Unlock()
	d.pairs = append(d.pairs, n)
}

// PairsPerCall returns the number of pairs of every accepted Encode and
// Decode call, in call order.
func (d *DeviceIndexed) PairsPerCall() []int {
	d.statsMu.Lock()
	defer d.statsMu.Unlock()
	return append([]int(nil), d.pairs...)
}

// ScratchStats reports the codec's idle, in-flight and orphaned scratch
// buffers (the host-mapped copies of index arrays).
func (d *DeviceIndexed) ScratchStats() (idle, inFlight, orphans int) { return d.scratch.stats() }

// Close closes the internal stream, frees the scratch and makes the codec
// unusable. The owner must have waited for the codec's stream work.
func (d *DeviceIndexed) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.hot = nil
	var errs []error
	if d.internal != nil {
		if err := d.internal.Close(); err != nil {
			errs = append(errs, err)
		}
		d.internal = nil
	}
	if err := d.scratch.close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
