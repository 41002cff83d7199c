package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stddef.h>
#include "kvcm/kvcm.h"

// tc_config_v1_size is where the fields of ABI version 2 start.
static uint32_t tc_config_v1_size(void) { return (uint32_t)offsetof(kvcm_manager_config, reuse_match_backoff); }
*/
import "C"

// ConfigDefect is a defect ValidateDefectiveConfig writes into a built
// kvcm_manager_config, to reach the converters' checks that a Config cannot
// express.
type ConfigDefect int

const (
	// NullRole sets layers[0].buffers[0].role to NULL.
	NullRole ConfigDefect = iota
	// NullLayers sets layers to NULL, keeping num_layers.
	NullLayers
	// EmptyInitialPoolRatio sets a non-NULL initial_pool_ratio of length 0.
	EmptyInitialPoolRatio
	// NullTypicalStepRequests sets a typical_step whose requests are NULL
	// with num_requests 1.
	NullTypicalStepRequests
	// V2FieldsBeyondV1Size writes invalid values into fields ABI version 2
	// appended (reuse_match_backoff -1, block_key 7) and sets struct_size to
	// the end of the version 1 fields.
	V2FieldsBeyondV1Size
	// V2FieldsInvalid writes the same invalid values with the full
	// struct_size.
	V2FieldsInvalid
)

// ValidateDefectiveConfig builds cfg, writes the defect and calls
// kvcm_config_validate.
func ValidateDefectiveConfig(cfg Config, d ConfigDefect) error {
	var a arena
	defer a.free()
	c := cfg.build(&a)
	switch d {
	case NullRole:
		c.layers.buffers.role = nil
	case NullLayers:
		c.layers = nil
	case EmptyInitialPoolRatio:
		c.initial_pool_ratio = (*C.double)(a.alloc(C.sizeof_double))
		c.num_initial_pool_ratio = 0
	case NullTypicalStepRequests:
		b := (*C.kvcm_batch_desc)(a.alloc(C.sizeof_kvcm_batch_desc))
		b.num_requests = 1
		c.typical_step = b
	case V2FieldsBeyondV1Size, V2FieldsInvalid:
		c.reuse_match_backoff = -1
		c.block_key = 7
		if d == V2FieldsBeyondV1Size {
			c.struct_size = C.tc_config_v1_size()
		}
	}
	return status(C.kvcm_config_validate(c))
}
