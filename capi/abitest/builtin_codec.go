package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdbool.h>
#include "kvcm/kvcm.h"

static bool tc_call_configure(kvcm_cold_page_codec c) { return c.vtable->configure(c.self, NULL, 0); }
static void tc_call_destroy(kvcm_cold_page_codec c) { c.vtable->destroy(c.self); }
*/
import "C"

// BuiltinCodecOptions is a kvcm_builtin_codec_options; StructSize 0 means
// the full struct.
type BuiltinCodecOptions struct {
	StructSize     uint32
	Kind           int32
	Element        int32
	BlockElems     int32
	CrossoverBytes int64
}

// Built-in codec kinds and element types (kvcm_builtin_codec, kvcm_element_type).
const (
	BuiltinDefault  = int32(C.KVCM_BUILTIN_CODEC_DEFAULT)
	BuiltinGather   = int32(C.KVCM_BUILTIN_CODEC_GATHER)
	BuiltinFp8      = int32(C.KVCM_BUILTIN_CODEC_FP8)
	BuiltinAuto     = int32(C.KVCM_BUILTIN_CODEC_AUTO)
	ElementFloat16  = int32(C.KVCM_ELEMENT_FLOAT16)
	ElementBfloat16 = int32(C.KVCM_ELEMENT_BFLOAT16)
)

// NewBuiltinCodec calls kvcm_create_builtin_cold_page_codec.
func NewBuiltinCodec(o BuiltinCodecOptions) (*Codec, error) {
	opts := C.kvcm_builtin_codec_options{
		struct_size: C.uint32_t(C.sizeof_kvcm_builtin_codec_options), abi_version: C.KVCM_ABI_VERSION,
		kind: C.kvcm_builtin_codec(o.Kind), element: C.kvcm_element_type(o.Element),
		block_elems: C.int32_t(o.BlockElems), crossover_bytes: C.int64_t(o.CrossoverBytes),
	}
	if o.StructSize != 0 {
		opts.struct_size = C.uint32_t(o.StructSize)
	}
	var c Codec
	if err := status(C.kvcm_create_builtin_cold_page_codec(&opts, &c.c)); err != nil {
		return nil, err
	}
	return &c, nil
}

// CallConfigure calls the codec object's configure slot directly, with no
// groups.
func (c *Codec) CallConfigure() bool { return bool(C.tc_call_configure(c.c)) }

// CallDestroy calls the codec object's destroy slot directly.
func (c *Codec) CallDestroy() { C.tc_call_destroy(c.c) }
