/* The vtable of the default codec object (kvcm_create_default_cold_page_codec):
 * each slot forwards to a Go export with self as the codec's handle. */
#include "kvcm/kvcm.h"
#include "kvcm_internal.h"

static bool dc_configure(void* self, const kvcm_pool_group_desc* gpu_descs, kvcm_pool_group_index num_gpu_descs) {
    return kvcm__go_default_configure((uintptr_t)self, (kvcm_pool_group_desc*)gpu_descs, num_gpu_descs);
}

static size_t dc_query_cold_page_bytes(void* self, kvcm_layer_group_id layer_group_id) {
    return kvcm__go_default_query_cold_page_bytes((uintptr_t)self, layer_group_id);
}

static kvcm_layer_group_id dc_get_batching_layer_group_id(void* self, kvcm_layer_group_id layer_group_id) {
    return kvcm__go_default_get_batching_layer_group_id((uintptr_t)self, layer_group_id);
}

static kvcm_page_index_location dc_query_page_index_location(void* self, kvcm_layer_group_id layer_group_id) {
    return kvcm__go_default_query_page_index_location((uintptr_t)self, layer_group_id);
}

static bool dc_encode(void* self, kvcm_layer_group_id layer_group_id, void* dst_base, const kvcm_page_index_pair* page_indices,
                      size_t num_base_pages, kvcm_stream stream) {
    return kvcm__go_default_encode((uintptr_t)self, layer_group_id, (uintptr_t)dst_base, (uintptr_t)page_indices, num_base_pages, stream);
}

static bool dc_decode(void* self, kvcm_layer_group_id layer_group_id, const void* src_base, const kvcm_page_index_pair* page_indices,
                      size_t num_base_pages, kvcm_stream stream) {
    return kvcm__go_default_decode((uintptr_t)self, layer_group_id, (uintptr_t)src_base, (uintptr_t)page_indices, num_base_pages, stream);
}

static void dc_destroy(void* self) { kvcm__go_default_destroy((uintptr_t)self); }

const kvcm_cold_page_codec_vtable kvcm__default_codec_vtable = {
    (uint32_t)sizeof(kvcm_cold_page_codec_vtable),
    KVCM_ABI_VERSION,
    dc_configure,
    dc_query_cold_page_bytes,
    dc_get_batching_layer_group_id,
    dc_query_page_index_location,
    dc_encode,
    dc_decode,
    dc_destroy,
};
