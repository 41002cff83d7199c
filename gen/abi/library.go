package abi

import "github.com/kvcm/kvcm/gen/spec"

// GetAPI returns the library's function table for an ABI version, or NULL
// when the library does not implement that version (newer than
// KVCM_ABI_VERSION, or 0). The table's struct_size tells which slots it has;
// it is static and never freed. This entry point is never versioned.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:impl api
//kvcm:param version in The ABI version the caller was built against (KVCM_ABI_VERSION).
//kvcm:returns The function table, or NULL.
type GetAPI func(version uint32) spec.In[API]

// API is the function table kvcm_get_api returns: struct_size, abi_version,
// then one pointer per function of the ABI, in the order the functions
// appeared (by version, then by name). Slots are only ever appended.
//
//kvcm:opaque
//kvcm:apitable
//kvcm:since 1
type API struct{}

// GetABIVersion returns KVCM_ABI_VERSION of the library (which may be newer
// than the header the caller was built with).
//
//kvcm:since 1
//kvcm:thread any
//kvcm:returns The library's ABI version.
type GetABIVersion func() uint32

// GetLibraryVersion returns the library's version string, "major.minor.patch".
//
//kvcm:since 1
//kvcm:thread any
//kvcm:impl c
//kvcm:returns A static NUL-terminated string; never freed.
type GetLibraryVersion func() spec.CStr

// StatusGetCode returns the code of a status; KVCM_OK for NULL.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:impl c
//kvcm:param status nullable The status (NULL is success).
//kvcm:returns The status code.
type StatusGetCode func(status spec.In[Status]) StatusCode

// StatusGetMessage returns the message of a status; "" for NULL.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:impl c
//kvcm:param status nullable The status (NULL is success).
//kvcm:returns A NUL-terminated string owned by the status, valid until kvcm_status_free.
type StatusGetMessage func(status spec.In[Status]) spec.CStr

// StatusFree frees a status. NULL is a no-op.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:impl c
//kvcm:param status consumed,nullable The status to free.
type StatusFree func(status spec.Out[Status])

// StatusCodeName returns the name of a status code, such as
// "KVCM_ERR_INVALID_ARGUMENT", or "KVCM_ERR_UNKNOWN" for an unknown code.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:impl c
//kvcm:param code in The code.
//kvcm:returns A static NUL-terminated string.
type StatusCodeName func(code StatusCode) spec.CStr

// LiveHandleCount returns the number of live handles of every type
// (managers, KV caches, default and built-in codec objects not yet
// consumed), for leak tests.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:returns The number of live handles.
type LiveHandleCount func() uint64

// IsPoisoned reports whether an earlier call panicked and poisoned the
// library.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:returns true when the library is poisoned.
type IsPoisoned func() bool

// DebugPanic panics inside the library, for tests that prove a panic becomes
// KVCM_ERR_INTERNAL and poisons the library. It does nothing (and returns
// KVCM_ERR_UNSUPPORTED) unless the environment variable KVCM_ENABLE_DEBUG_PANIC
// is set to 1. Never call it in production: it poisons the process's library.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param message nullable,string The panic message (NULL or "": "kvcm_debug_panic").
type DebugPanic func(message spec.CStr) *Status
