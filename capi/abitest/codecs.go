// Package abitest drives libkvcm's C ABI from Go, for tests: a _test.go file
// cannot import "C", so the cgo calls live here, behind a Go-typed API, and
// the tests in this directory call it. Linking this package links package
// capi, so the C functions called here are the exports of libkvcm.so,
// resolved in the test binary itself.
//
// The preamble also holds test codecs written in C against the vtable: a
// concatenating host codec that submits its copies with kvcm_stream_batch_copy
// and counts its calls with a host function (so it works on the emulated
// device and on CUDA alike), a codec whose configure returns false, one whose
// decode returns false, and broken vtables.
package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kvcm/kvcm.h"

// Counters, read by the tests.
int64_t tc_destroyed, tc_configured, tc_encodes, tc_decodes, tc_host_funcs, tc_bad_calls;

static void tc_count(int64_t* c) { __atomic_add_fetch(c, 1, __ATOMIC_SEQ_CST); }
static int64_t tc_get(int64_t* c) { return __atomic_load_n(c, __ATOMIC_SEQ_CST); }

typedef struct {
	int32_t index;
	int64_t page_bytes;
	size_t num_pools;
	kvcm_pool_desc* pools;
	size_t num_lcs;
	int32_t* lcs;
} tc_group;

typedef struct {
	int reject;
	int fail_decode;
	int configured;
	size_t num_groups;
	tc_group* groups;
} tc_codec;

static tc_group* tc_group_of(tc_codec* c, int32_t lg) {
	for (size_t i = 0; i < c->num_groups; i++) {
		for (size_t j = 0; j < c->groups[i].num_lcs; j++) {
			if (c->groups[i].lcs[j] == lg) return &c->groups[i];
		}
	}
	return NULL;
}

static bool tc_configure(void* self, const kvcm_pool_group_desc* d, kvcm_pool_group_index n) {
	tc_codec* c = (tc_codec*)self;
	tc_count(&tc_configured);
	if (c->reject || c->configured || n < 0) return false;
	c->configured = 1;
	c->num_groups = (size_t)n;
	c->groups = (tc_group*)calloc((size_t)n + 1, sizeof(tc_group));
	for (int32_t i = 0; i < n; i++) {
		tc_group* g = &c->groups[i];
		if (d[i].index != i) return false;
		g->index = d[i].index;
		g->num_pools = d[i].num_pools;
		g->pools = (kvcm_pool_desc*)calloc(d[i].num_pools + 1, sizeof(kvcm_pool_desc));
		memcpy(g->pools, d[i].pools, d[i].num_pools * sizeof(kvcm_pool_desc));
		g->num_lcs = d[i].num_life_cycles;
		g->lcs = (int32_t*)calloc(d[i].num_life_cycles + 1, sizeof(int32_t));
		memcpy(g->lcs, d[i].life_cycles, d[i].num_life_cycles * sizeof(int32_t));
		for (size_t j = 0; j < g->num_pools; j++) g->page_bytes += g->pools[j].slot_bytes;
	}
	return true;
}

static size_t tc_bytes(void* self, kvcm_layer_group_id lg) {
	tc_group* g = tc_group_of((tc_codec*)self, lg);
	return g ? (size_t)g->page_bytes : 0;
}

static kvcm_page_index_location tc_location(void* self, kvcm_layer_group_id lg) {
	return tc_group_of((tc_codec*)self, lg) ? KVCM_PAGE_INDEX_HOST : KVCM_PAGE_INDEX_BAD_LOCATION;
}

static int32_t tc_host_func(void* user) {
	(void)user;
	tc_count(&tc_host_funcs);
	return 0;
}

// tc_transform submits one copy per page and pool: hot slot <-> cold blob,
// then a host function on the same stream.
static bool tc_transform(tc_codec* c, kvcm_layer_group_id lg, uint64_t cold, const kvcm_page_index_pair* p, size_t n,
                         kvcm_stream s, int encode) {
	tc_group* g = tc_group_of(c, lg);
	if (g == NULL || (n > 0 && p == NULL)) {
		tc_count(&tc_bad_calls);
		return false;
	}
	if (n == 0) return true;
	kvcm_copy_desc* d = (kvcm_copy_desc*)calloc(n * g->num_pools, sizeof(kvcm_copy_desc));
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t off = 0;
		int32_t slot = encode ? p[i].src : p[i].dst;
		int32_t page = encode ? p[i].dst : p[i].src;
		for (size_t j = 0; j < g->num_pools; j++) {
			uint64_t hot = g->pools[j].base + (uint64_t)slot * (uint64_t)g->pools[j].slot_bytes;
			uint64_t blob = cold + (uint64_t)page * (uint64_t)g->page_bytes + off;
			d[k].dst = encode ? blob : hot;
			d[k].src = encode ? hot : blob;
			d[k].size = (uint64_t)g->pools[j].slot_bytes;
			off += (uint64_t)g->pools[j].slot_bytes;
			k++;
		}
	}
	kvcm_status* st = kvcm_stream_batch_copy(s, d, k);
	free(d);
	if (st != NULL) {
		kvcm_status_free(st);
		tc_count(&tc_bad_calls);
		return false;
	}
	st = kvcm_stream_enqueue_host_func(s, tc_host_func, NULL);
	if (st != NULL) {
		kvcm_status_free(st);
		return false;
	}
	tc_count(encode ? &tc_encodes : &tc_decodes);
	return true;
}

static bool tc_encode(void* self, kvcm_layer_group_id lg, void* dst, const kvcm_page_index_pair* p, size_t n, kvcm_stream s) {
	return tc_transform((tc_codec*)self, lg, (uint64_t)(uintptr_t)dst, p, n, s, 1);
}

static bool tc_decode(void* self, kvcm_layer_group_id lg, const void* src, const kvcm_page_index_pair* p, size_t n, kvcm_stream s) {
	if (((tc_codec*)self)->fail_decode) return false;
	return tc_transform((tc_codec*)self, lg, (uint64_t)(uintptr_t)src, p, n, s, 0);
}

static void tc_destroy(void* self) {
	tc_codec* c = (tc_codec*)self;
	for (size_t i = 0; i < c->num_groups; i++) {
		free(c->groups[i].pools);
		free(c->groups[i].lcs);
	}
	free(c->groups);
	free(c);
	tc_count(&tc_destroyed);
}

static const kvcm_cold_page_codec_vtable tc_vtable = {
	(uint32_t)sizeof(kvcm_cold_page_codec_vtable), KVCM_ABI_VERSION,
	tc_configure, tc_bytes, NULL, tc_location, tc_encode, tc_decode, tc_destroy,
};

// A vtable without encode: rejected, but still destroyed.
static const kvcm_cold_page_codec_vtable tc_vtable_no_encode = {
	(uint32_t)sizeof(kvcm_cold_page_codec_vtable), KVCM_ABI_VERSION,
	tc_configure, tc_bytes, NULL, tc_location, NULL, tc_decode, tc_destroy,
};

// A vtable whose abi_version was never set: rejected, but still destroyed.
static const kvcm_cold_page_codec_vtable tc_vtable_no_version = {
	(uint32_t)sizeof(kvcm_cold_page_codec_vtable), 0,
	tc_configure, tc_bytes, NULL, tc_location, tc_encode, tc_decode, tc_destroy,
};

// A vtable whose query_cold_page_bytes returns SIZE_MAX: rejected, reporting
// SIZE_MAX.
static size_t tc_bytes_max(void* self, kvcm_layer_group_id lg) {
	(void)self;
	(void)lg;
	return SIZE_MAX;
}

static const kvcm_cold_page_codec_vtable tc_vtable_size_max = {
	(uint32_t)sizeof(kvcm_cold_page_codec_vtable), KVCM_ABI_VERSION,
	tc_configure, tc_bytes_max, NULL, tc_location, tc_encode, tc_decode, tc_destroy,
};

static kvcm_cold_page_codec tc_new(int kind) {
	tc_codec* c = (tc_codec*)calloc(1, sizeof(tc_codec));
	kvcm_cold_page_codec out;
	out.self = c;
	switch (kind) {
	case 1: c->reject = 1; out.vtable = &tc_vtable; break;
	case 2: out.vtable = &tc_vtable_no_encode; break;
	case 3: out.vtable = &tc_vtable_no_version; break;
	case 4: c->fail_decode = 1; out.vtable = &tc_vtable; break;
	case 5: out.vtable = &tc_vtable_size_max; break;
	default: out.vtable = &tc_vtable; break;
	}
	return out;
}

int64_t tc_counting_runs;

static int32_t tc_counting(void* user) {
	tc_count(&tc_counting_runs);
	return (int32_t)(intptr_t)user;
}

// tc_enqueue_counting passes a small integer as user_data, as C callers do.
static kvcm_status* tc_enqueue_counting(kvcm_stream s, int32_t ret) {
	return kvcm_stream_enqueue_host_func(s, tc_counting, (void*)(intptr_t)ret);
}

static kvcm_status* tc_enqueue_null(kvcm_stream s) { return kvcm_stream_enqueue_host_func(s, NULL, NULL); }

static int tc_api_slot_ok(const kvcm_api* t) { return t->manager_create == kvcm_manager_create && t->get_abi_version == kvcm_get_abi_version; }

int64_t tc_priority_calls;
int32_t tc_priority_rc;

static int32_t tc_priority(void* user, int64_t block, int32_t* priority) {
	(void)block;
	tc_count(&tc_priority_calls);
	int32_t rc = __atomic_load_n(&tc_priority_rc, __ATOMIC_SEQ_CST);
	if (rc != 0) {
		return rc;
	}
	*priority = (int32_t)(intptr_t)user;
	return 0;
}

static void tc_set_priority_rc(int32_t rc) { __atomic_store_n(&tc_priority_rc, rc, __ATOMIC_SEQ_CST); }

static void tc_set_priority(kvcm_kv_cache_options* o, int32_t prio) {
	o->priority = tc_priority;
	o->priority_user_data = (void*)(intptr_t)prio;
}

static kvcm_cold_page_codec tc_null_vtable(void) {
	kvcm_cold_page_codec out = {NULL, NULL};
	return out;
}
*/
import "C"

// CodecKind selects a codec object for CreateManager.
type CodecKind int

const (
	// NoCodec passes NULL (the manager creates the default codec).
	NoCodec CodecKind = iota
	// DefaultCodec passes a kvcm_create_default_cold_page_codec object.
	DefaultCodec
	// ConcatCodec passes the C concatenating test codec.
	ConcatCodec
	// RejectingCodec passes a C codec whose configure returns false.
	RejectingCodec
	// NoEncodeCodec passes a C codec whose vtable lacks encode.
	NoEncodeCodec
	// NoVersionCodec passes a C codec whose vtable has abi_version 0.
	NoVersionCodec
	// NullVtableCodec passes a codec object whose vtable is NULL.
	NullVtableCodec
	// FailingDecodeCodec passes the C concatenating codec with a decode
	// that always returns false.
	FailingDecodeCodec
	// SizeMaxCodec passes a C codec whose query_cold_page_bytes returns
	// SIZE_MAX.
	SizeMaxCodec
)

// Codec is a codec object held by the test (it lives in Go memory: it only
// holds C pointers).
type Codec struct {
	c C.kvcm_cold_page_codec
}

// NewCodec makes a codec object of the given kind (not NoCodec).
func NewCodec(kind CodecKind) (*Codec, error) {
	switch kind {
	case DefaultCodec:
		var c Codec
		if err := status(C.kvcm_create_default_cold_page_codec(&c.c)); err != nil {
			return nil, err
		}
		return &c, nil
	case ConcatCodec:
		return &Codec{c: C.tc_new(0)}, nil
	case RejectingCodec:
		return &Codec{c: C.tc_new(1)}, nil
	case NoEncodeCodec:
		return &Codec{c: C.tc_new(2)}, nil
	case NoVersionCodec:
		return &Codec{c: C.tc_new(3)}, nil
	case NullVtableCodec:
		return &Codec{c: C.tc_null_vtable()}, nil
	case FailingDecodeCodec:
		return &Codec{c: C.tc_new(4)}, nil
	case SizeMaxCodec:
		return &Codec{c: C.tc_new(5)}, nil
	}
	return nil, nil
}

// Destroy hands the codec object to kvcm_cold_page_codec_destroy.
func (c *Codec) Destroy() error { return status(C.kvcm_cold_page_codec_destroy(&c.c)) }

// Counters are the C test codecs' counters.
type Counters struct {
	Destroyed, Configured, Encodes, Decodes, HostFuncs, BadCalls int64
}

// ReadCounters returns the C test codecs' counters (process-wide).
func ReadCounters() Counters {
	return Counters{
		Destroyed:  int64(C.tc_get(&C.tc_destroyed)),
		Configured: int64(C.tc_get(&C.tc_configured)),
		Encodes:    int64(C.tc_get(&C.tc_encodes)),
		Decodes:    int64(C.tc_get(&C.tc_decodes)),
		HostFuncs:  int64(C.tc_get(&C.tc_host_funcs)),
		BadCalls:   int64(C.tc_get(&C.tc_bad_calls)),
	}
}

// Sub returns c - d, field by field.
func (c Counters) Sub(d Counters) Counters {
	return Counters{c.Destroyed - d.Destroyed, c.Configured - d.Configured, c.Encodes - d.Encodes,
		c.Decodes - d.Decodes, c.HostFuncs - d.HostFuncs, c.BadCalls - d.BadCalls}
}

// EnqueueHostFunc enqueues, on stream s, a C host function that counts its
// runs and returns ret (passed as a small-integer user_data).
func EnqueueHostFunc(s uint64, ret int32) error {
	return status(C.tc_enqueue_counting(C.kvcm_stream(s), C.int32_t(ret)))
}

// EnqueueNullHostFunc calls kvcm_stream_enqueue_host_func with fn NULL.
func EnqueueNullHostFunc(s uint64) error { return status(C.tc_enqueue_null(C.kvcm_stream(s))) }

// HostFuncRuns is the number of runs of EnqueueHostFunc's function.
func HostFuncRuns() int64 { return int64(C.tc_get(&C.tc_counting_runs)) }

// APITable calls kvcm_get_api(version) and reports whether it returned a
// table, its struct_size and abi_version, and whether its slots are the
// exported functions.
func APITable(version uint32) (ok bool, size, abi uint32, slotsOK bool) {
	t := C.kvcm_get_api(C.uint32_t(version))
	if t == nil {
		return false, 0, 0, false
	}
	return true, uint32(t.struct_size), uint32(t.abi_version), C.tc_api_slot_ok(t) != 0
}

// PriorityCalls is the number of calls of the priority callback
// CreateCacheWithPriority installs.
func PriorityCalls() int64 { return int64(C.tc_get(&C.tc_priority_calls)) }

// SetPriorityFailure makes the priority callback CreateCacheWithPriority
// installs return rc (0: succeed with its priority).
func SetPriorityFailure(rc int32) { C.tc_set_priority_rc(C.int32_t(rc)) }

// setPriority installs a C priority callback returning prio.
func setPriority(o *C.kvcm_kv_cache_options, prio int32) { C.tc_set_priority(o, C.int32_t(prio)) }
