package abimodel

import (
	"math"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// ExternalCodec is a codec a user gives as a vtable (kvcm_cold_page_codec:
// a codec written in C, C++ or Python): its slots as funcs, nil where the
// vtable has none. capi's goCallerColdPageCodecVtable (generated from
// //kvcm:gocaller) fills it with funcs that call the C slots; NewExternalCodec
// makes it a codec.ColdPageCodec.
type ExternalCodec struct {
	Configure          func(gpuDescs []layout.PoolGroupDesc) bool
	QueryColdPageBytes func(lg layout.LayerGroupID) uint64
	// GetBatchingLayerGroupID may be nil: the identity.
	GetBatchingLayerGroupID func(lg layout.LayerGroupID) layout.LayerGroupID
	QueryPageIndexLocation  func(lg layout.LayerGroupID) codec.PageIndexLocation
	// Encode and Decode get the address of the n index pairs (host memory
	// that stays valid for the call, or device memory) and the stream's
	// native handle.
	Encode  func(lg layout.LayerGroupID, dstBase device.Ptr, pairs uintptr, n int, stream uintptr) bool
	Decode  func(lg layout.LayerGroupID, srcBase device.Ptr, pairs uintptr, n int, stream uintptr) bool
	Destroy func()
}

// externalCodec is an ExternalCodec as a codec.ColdPageCodec.
type externalCodec struct {
	ext       ExternalCodec
	destroyed atomic.Bool
}

// NewExternalCodec returns the codec that calls ext's funcs. Its rules:
// a slot ext lacks fails (false, 0, BadLocation), but for
// GetBatchingLayerGroupID, the identity; a size beyond int64 is 0 for
// QueryColdPageBytes and kept as is for NativeColdPageBytes (which the
// manager asks, to report it); Encode and Decode without a stream fail
// without calling the slot; Close calls Destroy once.
func NewExternalCodec(ext ExternalCodec) codec.ColdPageCodec { return &externalCodec{ext: ext} }

var (
	_ codec.ColdPageCodec = (*externalCodec)(nil)
	_ codec.NativeSizer   = (*externalCodec)(nil)
)

func (c *externalCodec) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	return c.ext.Configure != nil && c.ext.Configure(gpuDescs)
}

func (c *externalCodec) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	n := c.NativeColdPageBytes(lg)
	if n > math.MaxInt64 {
		return 0
	}
	return int64(n)
}

func (c *externalCodec) NativeColdPageBytes(lg layout.LayerGroupID) uint64 {
	if c.ext.QueryColdPageBytes == nil {
		return 0
	}
	return c.ext.QueryColdPageBytes(lg)
}

func (c *externalCodec) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	if c.ext.GetBatchingLayerGroupID == nil {
		return lg
	}
	return c.ext.GetBatchingLayerGroupID(lg)
}

func (c *externalCodec) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	if c.ext.QueryPageIndexLocation == nil {
		return codec.BadLocation
	}
	return c.ext.QueryPageIndexLocation(lg)
}

func (c *externalCodec) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return transformExternal(c.ext.Encode, lg, dstBase, idx, stream)
}

func (c *externalCodec) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return transformExternal(c.ext.Decode, lg, srcBase, idx, stream)
}

// transformExternal calls slot with the address of idx's pairs: host pairs
// are pinned for the call, device pairs are their device address.
func transformExternal(slot func(layout.LayerGroupID, device.Ptr, uintptr, int, uintptr) bool, lg layout.LayerGroupID, base device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	if slot == nil || stream == nil {
		return false
	}
	var addr uintptr
	switch h := idx.Host(); {
	case idx.Location() == codec.Device:
		addr = uintptr(idx.DevicePtr())
	case len(h) > 0:
		var pin runtime.Pinner
		pin.Pin(&h[0])
		defer pin.Unpin()
		addr = uintptr(unsafe.Pointer(&h[0]))
	}
	return slot(lg, base, addr, idx.Len(), stream.Handle())
}

// Close calls Destroy, exactly once.
func (c *externalCodec) Close() error {
	if c.destroyed.CompareAndSwap(false, true) && c.ext.Destroy != nil {
		c.ext.Destroy()
	}
	return nil
}
