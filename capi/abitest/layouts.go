package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include "kvcm/kvcm.h"
*/
import "C"

import "reflect"

// CStructs returns the Go views cgo made of every struct of kvcm.h, keyed by
// C name, so a test can compare their sizes and field offsets (as the C
// compiler laid them out) with the generator's model.
func CStructs() map[string]reflect.Type {
	return map[string]reflect.Type{
		"kvcm_attention_layer_config":    reflect.TypeFor[C.kvcm_attention_layer_config](),
		"kvcm_batch_desc":                reflect.TypeFor[C.kvcm_batch_desc](),
		"kvcm_block_stats":               reflect.TypeFor[C.kvcm_block_stats](),
		"kvcm_buffer_config":             reflect.TypeFor[C.kvcm_buffer_config](),
		"kvcm_buffer_location":           reflect.TypeFor[C.kvcm_buffer_location](),
		"kvcm_cache_event":               reflect.TypeFor[C.kvcm_cache_event](),
		"kvcm_cache_tier_config":         reflect.TypeFor[C.kvcm_cache_tier_config](),
		"kvcm_cold_page_codec":           reflect.TypeFor[C.kvcm_cold_page_codec](),
		"kvcm_cold_page_codec_vtable":    reflect.TypeFor[C.kvcm_cold_page_codec_vtable](),
		"kvcm_copy_desc":                 reflect.TypeFor[C.kvcm_copy_desc](),
		"kvcm_cp_index_object":           reflect.TypeFor[C.kvcm_cp_index_object](),
		"kvcm_cp_index_vtable":           reflect.TypeFor[C.kvcm_cp_index_vtable](),
		"kvcm_cp_manager_backed_options": reflect.TypeFor[C.kvcm_cp_manager_backed_options](),
		"kvcm_cp_request_id":             reflect.TypeFor[C.kvcm_cp_request_id](),
		"kvcm_kv_cache_options":          reflect.TypeFor[C.kvcm_kv_cache_options](),
		"kvcm_manager_config":            reflect.TypeFor[C.kvcm_manager_config](),
		"kvcm_migration_stats":           reflect.TypeFor[C.kvcm_migration_stats](),
		"kvcm_page_index_pair":           reflect.TypeFor[C.kvcm_page_index_pair](),
		"kvcm_peak_block_stats":          reflect.TypeFor[C.kvcm_peak_block_stats](),
		"kvcm_pool_desc":                 reflect.TypeFor[C.kvcm_pool_desc](),
		"kvcm_pool_group_desc":           reflect.TypeFor[C.kvcm_pool_group_desc](),
		"kvcm_pool_group_stats":          reflect.TypeFor[C.kvcm_pool_group_stats](),
		"kvcm_request_desc":              reflect.TypeFor[C.kvcm_request_desc](),
		"kvcm_reuse_scope":               reflect.TypeFor[C.kvcm_reuse_scope](),
	}
}
