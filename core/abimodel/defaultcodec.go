package abimodel

import (
	"sync"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// DefaultCodec is a codec object of the library's vtable: the default
// codec kvcm_create_default_cold_page_codec makes, which a manager takes
// (Codec) or its owner destroys, and whose slots its owner may also call
// directly, from any thread: they run one at a time. Or, for a built-in
// codec that runs on the manager's device
// (kvcm_create_builtin_cold_page_codec), only the choice (Builtin), which
// the manager makes on the device it opens: every slot but destroy fails
// on a choice (false, 0, -1, BadLocation).
type DefaultCodec struct {
	mu      sync.Mutex
	c       codec.ColdPageCodec // nil for a choice
	builtin *gpucodec.Spec
}

// NewDefaultCodec returns a default codec object.
func NewDefaultCodec() *DefaultCodec { return &DefaultCodec{c: codec.NewDefault()} }

// NewBuiltinChoice returns the codec object of a built-in codec's choice.
func NewBuiltinChoice(s gpucodec.Spec) *DefaultCodec { return &DefaultCodec{builtin: &s} }

// Codec is the codec, for the manager that takes the object (nil for a
// choice).
func (d *DefaultCodec) Codec() codec.ColdPageCodec { return d.c }

// Builtin is the built-in codec chosen, or nil for the default codec.
func (d *DefaultCodec) Builtin() *gpucodec.Spec { return d.builtin }

// Configure calls the codec's Configure.
func (d *DefaultCodec) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.c != nil && d.c.Configure(gpuDescs)
}

// QueryColdPageBytes calls the codec's QueryColdPageBytes; a negative size
// is 0 (failure).
func (d *DefaultCodec) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c == nil {
		return 0
	}
	return max(d.c.QueryColdPageBytes(lg), 0)
}

// GetBatchingLayerGroupID calls the codec's GetBatchingLayerGroupID.
func (d *DefaultCodec) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c == nil {
		return -1
	}
	return d.c.GetBatchingLayerGroupID(lg)
}

// QueryPageIndexLocation calls the codec's QueryPageIndexLocation.
func (d *DefaultCodec) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c == nil {
		return codec.BadLocation
	}
	return d.c.QueryPageIndexLocation(lg)
}

// Transform encodes (or decodes) the pairs view gives in the location the
// codec selects for lg; view reports false when the pairs cannot be viewed
// there, and then, like a location the codec rejects, Transform fails.
func (d *DefaultCodec) Transform(encode bool, lg layout.LayerGroupID, base device.Ptr, view func(codec.PageIndexLocation) (codec.PageIndices, bool), stream device.Stream) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c == nil {
		return false
	}
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
	return codec.Destroy(d.c) // nil for a choice: nothing to destroy
}
