package abimodel

import (
	"sync"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// DefaultCodec is the codec object kvcm_create_default_cold_page_codec
// makes: the default codec, which a manager takes (Codec) or its owner
// destroys, and whose slots its owner may also call directly, from any
// thread: they run one at a time.
type DefaultCodec struct {
	mu sync.Mutex
	c  codec.ColdPageCodec
}

// NewDefaultCodec returns a default codec object.
func NewDefaultCodec() *DefaultCodec { return &DefaultCodec{c: codec.NewDefault()} }

// Codec is the codec, for the manager that takes the object.
func (d *DefaultCodec) Codec() codec.ColdPageCodec { return d.c }

// Configure calls the codec's Configure.
func (d *DefaultCodec) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.c.Configure(gpuDescs)
}

// QueryColdPageBytes calls the codec's QueryColdPageBytes; a negative size
// is 0 (failure).
func (d *DefaultCodec) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(d.c.QueryColdPageBytes(lg), 0)
}

// GetBatchingLayerGroupID calls the codec's GetBatchingLayerGroupID.
func (d *DefaultCodec) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.c.GetBatchingLayerGroupID(lg)
}

// QueryPageIndexLocation calls the codec's QueryPageIndexLocation.
func (d *DefaultCodec) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.c.QueryPageIndexLocation(lg)
}

// Transform encodes (or decodes) the pairs view gives in the location the
// codec selects for lg; view reports false when the pairs cannot be viewed
// there, and then, like a location the codec rejects, Transform fails.
func (d *DefaultCodec) Transform(encode bool, lg layout.LayerGroupID, base device.Ptr, view func(codec.PageIndexLocation) (codec.PageIndices, bool), stream device.Stream) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	loc := d.c.QueryPageIndexLocation(lg)
	if loc != codec.Host && loc != codec.Device {
		return false
	}
	idx, ok := view(loc)
	switch {
	case !ok:
		return false
	case encode:
		return d.c.Encode(lg, base, idx, stream)
	}
	return d.c.Decode(lg, base, idx, stream)
}

// Destroy destroys the codec.
func (d *DefaultCodec) Destroy() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return codec.Destroy(d.c)
}
