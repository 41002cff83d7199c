/* Hand-written internals of libkvcm's C side: the status object. Not public. */
#ifndef KVCM_INTERNAL_H
#define KVCM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvcm/kvcm.h"

/* A status: a code and a NUL-terminated copy of the message, one allocation. */
struct kvcm_status {
    kvcm_status_code code;
    char message[];
};

/* kvcm__status_new copies len bytes of msg; it returns NULL when out of memory
 * (the caller then reports the static out-of-memory status). */
kvcm_status* kvcm__status_new(kvcm_status_code code, const char* msg, size_t len);

/* kvcm__status_oom is returned when a status cannot be allocated; freeing it
 * is a no-op. */
extern kvcm_status kvcm__status_oom;

/* The default codec object's vtable (default_codec.c): its slots forward to
 * the Go exports below with self as the codec's handle. */
extern const kvcm_cold_page_codec_vtable kvcm__default_codec_vtable;

extern bool kvcm__go_default_configure(uintptr_t self, kvcm_pool_group_desc* gpu_descs, kvcm_pool_group_index num_gpu_descs);
extern size_t kvcm__go_default_query_cold_page_bytes(uintptr_t self, kvcm_layer_group_id layer_group_id);
extern kvcm_layer_group_id kvcm__go_default_get_batching_layer_group_id(uintptr_t self, kvcm_layer_group_id layer_group_id);
extern kvcm_page_index_location kvcm__go_default_query_page_index_location(uintptr_t self, kvcm_layer_group_id layer_group_id);
extern bool kvcm__go_default_encode(uintptr_t self, kvcm_layer_group_id layer_group_id, uintptr_t dst_base, uintptr_t page_indices, size_t num_base_pages, kvcm_stream stream);
extern bool kvcm__go_default_decode(uintptr_t self, kvcm_layer_group_id layer_group_id, uintptr_t src_base, uintptr_t page_indices, size_t num_base_pages, kvcm_stream stream);
extern void kvcm__go_default_destroy(uintptr_t self);

static inline const kvcm_cold_page_codec_vtable* kvcm__default_vtable(void) { return &kvcm__default_codec_vtable; }

/* Addresses Go holds as uintptr_t, turned into C pointers on the C side. */
static inline const void* kvcm__ptr(uintptr_t p) { return (const void*)p; }
static inline const kvcm_page_index_pair* kvcm__pairs_at(uintptr_t p) { return (const kvcm_page_index_pair*)p; }

#endif /* KVCM_INTERNAL_H */
