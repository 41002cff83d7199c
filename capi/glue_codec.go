package capi

/*
#include <stdlib.h>
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// ---- Consuming a codec object ----

// coldPageCodecArg is a codec object taken from a caller: the codec wrapped
// for transfer, or the error found while taking it. The shim takes it before
// anything else and releases it on return, so whatever path the call takes
// the codec is either handed on (to core.NewManager, which consumes it) or
// destroyed.
type coldPageCodecArg struct {
	owned   *codec.Owned   // nil when none was passed or taking it failed
	builtin *gpucodec.Spec // a built-in codec object: made on the manager's device
	err     error          // why the codec object is unusable
}

// consumeColdPageCodec takes the codec object p. It never fails: problems
// are recorded in err and reported by the glue, after the object has been
// destroyed where that is possible.
func consumeColdPageCodec(p *C.kvcm__const_kvcm_cold_page_codec) *coldPageCodecArg {
	a := &coldPageCodecArg{}
	if p == nil {
		return a
	}
	vt := p.vtable
	self := C.kvcm__get_cold_page_codec_self(p)
	if vt == nil {
		a.err = argError("codec.vtable", "is NULL (the codec cannot be destroyed)")
		return a
	}
	if vt == C.kvcm__default_cold_page_codec_vtable() {
		obj, ok := takeDefaultCodec(uint64(self))
		switch {
		case !ok:
			a.err = errorf(codeInvalidHandle, "codec: the library codec object %#x was already consumed or never created", uint64(self))
		case obj.Builtin() != nil:
			a.builtin = obj.Builtin()
		default:
			a.owned = codec.Own(obj.Codec())
		}
		return a
	}
	if err := checkColdPageCodecVtable(vt); err != nil {
		a.err = err
		if C.kvcm__has_cold_page_codec_vtable_destroy(vt) != 0 {
			C.kvcm__call_cold_page_codec_vtable_destroy(vt, self) // consumed, also when unusable
		}
		return a
	}
	a.owned = codec.Own(abimodel.NewExternalCodec(goCallerColdPageCodecVtable(vt, self)))
	return a
}

// release destroys the codec unless it was handed on.
func (a *coldPageCodecArg) release() {
	if a.owned != nil && !a.owned.Consumed() {
		a.owned.Discard()
	}
}

func glueColdPageCodecDestroy(codecArg *coldPageCodecArg) error {
	// release (deferred by the shim) destroys it.
	return codecArg.err
}

// checkColdPageCodecVtable reports what makes a caller's codec vtable
// unusable.
func checkColdPageCodecVtable(vt *C.kvcm_cold_page_codec_vtable) error {
	if vt.abi_version == 0 {
		return argError("codec.vtable.abi_version", "is 0: set it to KVCM_ABI_VERSION")
	}
	if vt.struct_size < C.KVCM__COLD_PAGE_CODEC_VTABLE_SIZE_V1 {
		return argError("codec.vtable.struct_size", "is %d, less than the %d bytes of ABI version 1", vt.struct_size, C.KVCM__COLD_PAGE_CODEC_VTABLE_SIZE_V1)
	}
	if name := C.kvcm__missing_cold_page_codec_vtable(vt); name != nil {
		return argError("codec.vtable."+C.GoString(name), "is NULL")
	}
	return nil
}

// goPoolGroupDescs copies C descriptors into Go.
func goPoolGroupDescs(p *C.kvcm_pool_group_desc, n int) ([]layout.PoolGroupDesc, error) {
	if n < 0 {
		return nil, fmt.Errorf("bad descriptor count %d", n)
	}
	return cStructsArg(p, C.size_t(n), "gpu_descs", fromCPoolGroupDesc)
}

// ---- The default codec object ----

// defaultCodecObj is the object behind a codec object of the default
// codec's vtable (see abimodel.DefaultCodec); its handle is the object's
// self. Taking it (by kvcm_manager_create) or destroying it frees the
// handle, so the object is consumed once.
type defaultCodecObj struct {
	*abimodel.DefaultCodec
	handle uint64
}

func glueCreateDefaultColdPageCodec(out *C.kvcm_cold_page_codec) error {
	publishDefaultCodec(&defaultCodecObj{DefaultCodec: abimodel.NewDefaultCodec()}, out)
	return nil
}

func glueCreateBuiltinColdPageCodec(opts *C.kvcm__const_kvcm_builtin_codec_options, out *C.kvcm_cold_page_codec) error {
	s := gpucodec.Spec{
		Kind: gpucodec.Kind(opts.kind), Format: gpucodec.Format(opts.element),
		BlockElems: int(opts.block_elems), CrossoverBytes: int64(opts.crossover_bytes),
	}
	if err := s.Validate(); err != nil {
		var se *gpucodec.SpecError
		if errors.As(err, &se) {
			return argError("options."+se.Field, "%s", se.Reason)
		}
		return err
	}
	if s.Kind == gpucodec.KindDefault {
		return glueCreateDefaultColdPageCodec(out)
	}
	publishDefaultCodec(&defaultCodecObj{DefaultCodec: abimodel.NewBuiltinChoice(s)}, out)
	return nil
}

// publishDefaultCodec issues obj's handle and writes the codec object.
func publishDefaultCodec(obj *defaultCodecObj, out *C.kvcm_cold_page_codec) {
	obj.handle = newHandle(obj)
	out.vtable = C.kvcm__default_cold_page_codec_vtable()
	C.kvcm__set_cold_page_codec_self(out, C.uintptr_t(obj.handle))
}

// takeDefaultCodec frees the handle and returns its object.
func takeDefaultCodec(h uint64) (*defaultCodecObj, bool) {
	obj, ok := lookupDefault(C.uintptr_t(h))
	if !ok || !deleteHandle(h) {
		return nil, false
	}
	return obj, true
}

// lookupDefault finds the live object self of the default codec's vtable
// (the generated slot exports call it), a built-in codec's choice included.
func lookupDefault(self C.uintptr_t) (*defaultCodecObj, bool) {
	v, ok := handleValue(uint64(self))
	if !ok {
		return nil, false
	}
	obj, ok := v.(*defaultCodecObj)
	return obj, ok
}

func glueDefaultConfigure(obj *defaultCodecObj, gpuDescs C.uintptr_t, n C.kvcm_pool_group_index) C.bool {
	descs, err := goPoolGroupDescs((*C.kvcm_pool_group_desc)(C.kvcm__ptr(gpuDescs)), int(n))
	return C.bool(err == nil && obj.Configure(descs))
}

func glueDefaultQueryColdPageBytes(obj *defaultCodecObj, lg C.kvcm_layer_group_id) C.size_t {
	return C.size_t(obj.QueryColdPageBytes(layout.LayerGroupID(lg)))
}

func glueDefaultGetBatchingLayerGroupID(obj *defaultCodecObj, lg C.kvcm_layer_group_id) C.kvcm_layer_group_id {
	return C.kvcm_layer_group_id(obj.GetBatchingLayerGroupID(layout.LayerGroupID(lg)))
}

func glueDefaultQueryPageIndexLocation(obj *defaultCodecObj, lg C.kvcm_layer_group_id) C.kvcm_page_index_location {
	return C.kvcm_page_index_location(obj.QueryPageIndexLocation(layout.LayerGroupID(lg)))
}

func glueDefaultEncode(obj *defaultCodecObj, lg C.kvcm_layer_group_id, dst, pairs C.uintptr_t, n C.size_t, stream C.kvcm_stream) C.bool {
	return defaultTransform(obj, true, lg, dst, pairs, n, stream)
}

func glueDefaultDecode(obj *defaultCodecObj, lg C.kvcm_layer_group_id, src, pairs C.uintptr_t, n C.size_t, stream C.kvcm_stream) C.bool {
	return defaultTransform(obj, false, lg, src, pairs, n, stream)
}

// defaultTransform views the caller's pairs where the codec wants them: a
// host slice over the C array, or the device address.
func defaultTransform(obj *defaultCodecObj, encode bool, lg C.kvcm_layer_group_id, base, pairs C.uintptr_t, n C.size_t, stream C.kvcm_stream) C.bool {
	s, err := resolveStream(stream)
	if err != nil || n > 0 && pairs == 0 || uint64(n) > math.MaxInt32 {
		return false
	}
	return C.bool(obj.Transform(encode, layout.LayerGroupID(lg), device.Ptr(base), func(loc codec.PageIndexLocation) (codec.PageIndices, bool) {
		switch {
		case loc == codec.Device:
			return codec.DeviceIndices(device.Ptr(pairs), int(n)), true
		case n == 0:
			return codec.HostIndices(nil), true
		}
		return codec.HostIndices(unsafe.Slice((*codec.PageIndexPair)(C.kvcm__ptr(pairs)), int(n))), true
	}, s))
}

func glueDefaultDestroy(obj *defaultCodecObj) {
	if deleteHandle(obj.handle) {
		obj.Destroy()
	}
}
