/* Hand-written C side of libkvcm: status objects and static strings. These
 * functions never enter Go, so they work even when the library is poisoned. */
#include <stdlib.h>
#include <string.h>

#include "kvcm/kvcm.h"
#include "kvcm_internal.h"
#include "shim_generated.h"

kvcm_status kvcm__status_oom = {KVCM_ERR_INTERNAL};

kvcm_status* kvcm__status_new(kvcm_status_code code, const char* msg, size_t len) {
    kvcm_status* s = (kvcm_status*)malloc(sizeof(kvcm_status) + len + 1);
    if (s == NULL) {
        return NULL;
    }
    s->code = code;
    if (len > 0) {
        memcpy(s->message, msg, len);
    }
    s->message[len] = '\0';
    return s;
}

kvcm_status_code kvcm_status_get_code(const kvcm_status* status) {
    return status == NULL ? KVCM_OK : status->code;
}

const char* kvcm_status_get_message(const kvcm_status* status) {
    if (status == NULL) {
        return "";
    }
    if (status == &kvcm__status_oom) {
        return "out of memory while reporting an error";
    }
    return status->message;
}

void kvcm_status_free(kvcm_status* status) {
    if (status != NULL && status != &kvcm__status_oom) {
        free(status);
    }
}

const char* kvcm_get_library_version(void) {
    return KVCM_VERSION_STRING;
}

const char* kvcm_status_code_name(kvcm_status_code code) {
    const char* name = kvcm__enum_name_status_code(code);
    return name != NULL ? name : "KVCM_ERR_UNKNOWN";
}
