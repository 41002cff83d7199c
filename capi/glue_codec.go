package capi

/*
#include <stdlib.h>
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
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
	ext := goCallerColdPageCodecVtable(vt, self)
	if a.err = checkColdPageCodecVtable(vt, "codec.vtable"); a.err != nil {
		if ext.Destroy != nil {
			ext.Destroy() // consumed, also when unusable
		}
		return a
	}
	a.owned = codec.Own(abimodel.NewExternalCodec(ext))
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

// ---- The default codec object ----

func glueCreateDefaultColdPageCodec(out *C.kvcm_cold_page_codec) error {
	publishDefaultCodec(abimodel.NewDefaultCodec(), out)
	return nil
}

func glueCreateBuiltinColdPageCodec(s gpucodec.Spec, out *C.kvcm_cold_page_codec) error {
	obj, err := abimodel.NewBuiltinCodec(s)
	if err != nil {
		return err
	}
	publishDefaultCodec(obj, out)
	return nil
}

// publishDefaultCodec issues obj's handle, the self of the default
// codec's vtable (whose generated slots find obj by lookupDefault), and
// writes the codec object.
func publishDefaultCodec(obj *abimodel.DefaultCodec, out *C.kvcm_cold_page_codec) {
	out.vtable = C.kvcm__default_cold_page_codec_vtable()
	C.kvcm__set_cold_page_codec_self(out, C.uintptr_t(newHandle(obj)))
}

// takeDefaultCodec frees the handle and returns its object.
func takeDefaultCodec(h uint64) (*abimodel.DefaultCodec, bool) {
	obj, ok := lookupDefault(C.uintptr_t(h))
	if !ok || !deleteHandle(h) {
		return nil, false
	}
	return obj, true
}
