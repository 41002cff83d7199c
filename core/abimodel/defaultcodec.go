package abimodel

import (
	"errors"
	"math"
	"sync"
	"unsafe"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// DefaultCodec is a codec object of the library's vtable: the default
// codec kvcm_create_default_cold_page_codec makes, which a manager takes
// (Codec) or its owner destroys, and whose slots its owner may also call
// directly, from any thread: they run one at a time. Its methods are the
// slots of kvcm_cold_page_codec_vtable (the library's table, generated
// from //kvcm:goimpl), in the slots' Go form. Or, for a built-in
// codec that runs on the manager's device
// (kvcm_create_builtin_cold_page_codec), only the choice (Builtin), which
// the manager makes on the device it opens: every slot but destroy fails
// on a choice (false, 0, -1, BadLocation).
type DefaultCodec struct {
	mu      sync.Mutex
	c       codec.ColdPageCodec // nil for a choice
	builtin *gpucodec.Spec
	reg     *DeviceRegistry // where stream handles resolve; nil: Devices
}

// NewDefaultCodec returns a default codec object.
func NewDefaultCodec() *DefaultCodec { return &DefaultCodec{c: codec.NewDefault()} }

// NewBuiltinChoice returns the codec object of a built-in codec's choice.
func NewBuiltinChoice(s gpucodec.Spec) *DefaultCodec { return &DefaultCodec{builtin: &s} }

// NewBuiltinCodec returns the codec object kvcm_create_builtin_cold_page_codec
// makes: the default codec's for KindDefault, else the choice. Bad options
// are ErrInvalidArgument naming the field of options.
func NewBuiltinCodec(s gpucodec.Spec) (*DefaultCodec, error) {
	if err := s.Validate(); err != nil {
		var se *gpucodec.SpecError
		if errors.As(err, &se) {
			return nil, argErr("options."+se.Field, "%s", se.Reason)
		}
		return nil, err
	}
	if s.Kind == gpucodec.KindDefault {
		return NewDefaultCodec(), nil
	}
	return NewBuiltinChoice(s), nil
}

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

// Encode is the encode slot: it encodes the n index pairs at the address
// pairs, in the location the codec selects for lg (host memory the caller
// keeps valid for the call, or a device address), on the stream of the
// native handle stream. It fails, calling nothing, when the stream is not
// a live manager's, n is negative or above MaxInt32, pairs is 0 with n > 0,
// or the codec rejects the location.
func (d *DefaultCodec) Encode(lg layout.LayerGroupID, dstBase device.Ptr, pairs uintptr, n int, stream uintptr) bool {
	return d.transform(true, lg, dstBase, pairs, n, stream)
}

// Decode is the decode slot, as Encode.
func (d *DefaultCodec) Decode(lg layout.LayerGroupID, srcBase device.Ptr, pairs uintptr, n int, stream uintptr) bool {
	return d.transform(false, lg, srcBase, pairs, n, stream)
}

func (d *DefaultCodec) transform(encode bool, lg layout.LayerGroupID, base device.Ptr, pairs uintptr, n int, stream uintptr) bool {
	s, err := d.streams().Stream(stream)
	if err != nil || n < 0 || n > math.MaxInt32 || n > 0 && pairs == 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c == nil {
		return false
	}
	var idx codec.PageIndices
	switch loc := d.c.QueryPageIndexLocation(lg); {
	case loc == codec.Device:
		idx = codec.DeviceIndices(device.Ptr(pairs), n)
	case loc != codec.Host:
		return false
	case n == 0:
		idx = codec.HostIndices(nil)
	default:
		// The caller's pairs: memory outside Go's heap (or pinned) that
		// stays valid for the call.
		idx = codec.HostIndices(unsafe.Slice((*codec.PageIndexPair)(unsafe.Add(nil, pairs)), n))
	}
	if encode {
		return d.c.Encode(lg, base, idx, s)
	}
	return d.c.Decode(lg, base, idx, s)
}

// streams is the registry the slots' stream handles resolve in.
func (d *DefaultCodec) streams() *DeviceRegistry {
	if d.reg != nil {
		return d.reg
	}
	return Devices
}

// Destroy is the destroy slot: it destroys the codec (nothing for a
// choice). A codec's Close error has no one to go to: the slot returns
// nothing.
func (d *DefaultCodec) Destroy() {
	d.mu.Lock()
	defer d.mu.Unlock()
	_ = codec.Destroy(d.c)
}
