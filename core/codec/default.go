package codec

import (
	"sync"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// NewDefault returns the default lossless concatenating codec, the one a
// manager uses when given none:
//
//   - The cold page of lifecycle lg is the concatenation, in pool order, of
//     the page's slot bytes in every pool of lg's hot pool group, so
//     QueryColdPageBytes(lg) is the group's PageBytes.
//   - Indices are on the Host; Encode and Decode consume them before they
//     return.
//   - Batching is the identity (no cross-lifecycle batching).
//   - Each Encode or Decode builds one device.CopyDesc per page and hot pool
//     (page-major, pools in order) and submits the whole array with exactly
//     one stream.BatchCopy: never chunked, no alignment or work-size policy;
//     splitting at host-registration boundaries is the device backend's job.
//     A call with no pairs is a successful no-op that enqueues nothing.
//   - Every index is validated before anything is submitted: a call on an
//     unconfigured or closed codec, for an unknown lifecycle, with device
//     indices, a nil stream, a null cold base, a hot slot outside [0,
//     NumSlots) or a negative cold index returns false with nothing enqueued.
//
// The descriptor array is reused across calls (device.Stream.BatchCopy does
// not retain it), so steady-state Encode and Decode do not allocate. Close
// makes the codec unusable: every later call fails.
func NewDefault() ColdPageCodec { return &concatCodec{} }

type concatCodec struct {
	mu         sync.Mutex
	hot        *HotLayout
	configured bool // Configure was called, whatever its result
	closed     bool
	descs      []device.CopyDesc
}

func (c *concatCodec) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.configured {
		return false
	}
	c.configured = true
	h, err := NewHotLayout(gpuDescs)
	if err != nil {
		return false
	}
	c.hot = h
	return true
}

func (c *concatCodec) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hot.PageBytes(lg) // 0 when unconfigured, closed or unknown
}

func (c *concatCodec) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hot.GetBatchingLayerGroupID(lg)
}

func (c *concatCodec) QueryPageIndexLocation(lg layout.LayerGroupID) PageIndexLocation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hot.Known(lg) {
		return BadLocation
	}
	return Host
}

func (c *concatCodec) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx PageIndices, stream device.Stream) bool {
	return c.transfer(lg, ToCold, dstBase, idx, stream)
}

func (c *concatCodec) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx PageIndices, stream device.Stream) bool {
	return c.transfer(lg, ToHot, srcBase, idx, stream)
}

func (c *concatCodec) transfer(lg layout.LayerGroupID, dir Direction, coldBase device.Ptr, idx PageIndices, stream device.Stream) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.hot.GroupOf(lg)
	if g == nil || idx.Location() != Host {
		return false
	}
	pairs := idx.Host()
	if len(pairs) == 0 {
		return true
	}
	if stream == nil {
		return false
	}
	descs, err := c.hot.AppendConcatCopies(c.descs[:0], lg, dir, coldBase, g.PageBytes(), pairs)
	c.descs = descs[:0] // keep the grown buffer even on error
	if err != nil {
		return false
	}
	return stream.BatchCopy(descs) == nil
}

// Close releases the codec; later calls fail. It is idempotent.
func (c *concatCodec) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.hot = nil
	c.descs = nil
	return nil
}
