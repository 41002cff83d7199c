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

#endif /* KVCM_INTERNAL_H */
