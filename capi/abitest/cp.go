package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvcm/kvcm.h"

// A CP index written in C against kvcm_cp_index_vtable, configurable per
// object; every call is counted in globals the tests read.
int64_t ti_destroyed, ti_predicts, ti_cached_calls, ti_alloc_calls, ti_alloc_keys, ti_freed_calls,
	ti_freed_keys, ti_priority_calls;
char ti_last_id[256];

static void ti_count(int64_t* c, int64_t n) { __atomic_add_fetch(c, n, __ATOMIC_SEQ_CST); }
static int64_t ti_get(int64_t* c) { return __atomic_load_n(c, __ATOMIC_SEQ_CST); }

enum { TI_REVERSE = 0, TI_GARBAGE = 1, TI_SHORT_NEEDED = 2 };

typedef struct {
	double score;
	int fail;
	int priority_mode;
	size_t num_cached;
} ti_index;

static void ti_remember(const char* id, size_t n) {
	if (n > 255) n = 255;
	if (n > 0) memcpy(ti_last_id, id, n);
	ti_last_id[n] = 0;
}

static int32_t ti_predict(void* self, const char* id, size_t n, const kvcm_token* t, size_t nt, double* score) {
	ti_index* x = (ti_index*)self;
	ti_count(&ti_predicts, 1);
	ti_remember(id, n);
	if (x->fail) return 7;
	*score = x->score;
	return 0;
}

static int32_t ti_cached(void* self, const char* id, size_t n, uint64_t* keys, size_t cap, size_t* needed) {
	ti_index* x = (ti_index*)self;
	ti_count(&ti_cached_calls, 1);
	if (x->fail) return 1;
	*needed = x->num_cached;
	if (x->priority_mode == TI_SHORT_NEEDED) {
		*needed = cap + 1; // always wants more: a broken index
		return 0;
	}
	if (x->num_cached > cap) return 0;
	for (size_t i = 0; i < x->num_cached; i++) keys[i] = 1000 + i;
	return 0;
}

static int32_t ti_alloc(void* self, const char* id, size_t n, const uint64_t* keys, size_t nk) {
	ti_index* x = (ti_index*)self;
	ti_count(&ti_alloc_calls, 1);
	ti_count(&ti_alloc_keys, (int64_t)nk);
	ti_remember(id, n);
	return x->fail ? 3 : 0;
}

static int32_t ti_freed(void* self, const char* id, size_t n, const uint64_t* keys, size_t nk) {
	ti_index* x = (ti_index*)self;
	ti_count(&ti_freed_calls, 1);
	ti_count(&ti_freed_keys, (int64_t)nk);
	ti_remember(id, n);
	return x->fail ? 3 : 0;
}

static int32_t ti_priority(void* self, const kvcm_cp_request_id* ids, size_t n, size_t* order) {
	ti_index* x = (ti_index*)self;
	ti_count(&ti_priority_calls, 1);
	if (x->fail) return 2;
	for (size_t i = 0; i < n; i++) {
		if (x->priority_mode == TI_GARBAGE) {
			order[i] = i == 0 ? 999 : 0; // out of range, then index 0 repeated
		} else {
			order[i] = n - 1 - i;
		}
	}
	return 0;
}

static void ti_destroy(void* self) {
	ti_count(&ti_destroyed, 1);
	free(self);
}

enum { TI_PREDICT = 1, TI_CACHED = 2, TI_ALLOC = 4, TI_FREED = 8, TI_PRIORITY = 16, TI_DESTROY = 32 };

static kvcm_cp_index_vtable* ti_vtable(unsigned slots, uint32_t struct_size, uint32_t abi) {
	kvcm_cp_index_vtable* vt = (kvcm_cp_index_vtable*)calloc(1, sizeof(kvcm_cp_index_vtable));
	vt->struct_size = struct_size ? struct_size : (uint32_t)sizeof(kvcm_cp_index_vtable);
	vt->abi_version = abi;
	if (slots & TI_PREDICT) vt->predict_prefix_reuse = ti_predict;
	if (slots & TI_CACHED) vt->get_cp_cached_blocks = ti_cached;
	if (slots & TI_ALLOC) vt->notify_blocks_allocated = ti_alloc;
	if (slots & TI_FREED) vt->notify_blocks_freed = ti_freed;
	if (slots & TI_PRIORITY) vt->get_allocation_priority = ti_priority;
	if (slots & TI_DESTROY) vt->destroy = ti_destroy;
	return vt;
}

static kvcm_status* ti_create(kvcm_cp_index_vtable* vt, double score, int fail, int mode, size_t num_cached, int null_object, int null_out, kvcm_cp_index* out) {
	ti_index* x = (ti_index*)calloc(1, sizeof(ti_index));
	x->score = score;
	x->fail = fail;
	x->priority_mode = mode;
	x->num_cached = num_cached;
	kvcm_cp_index_object obj = {vt, x};
	kvcm_status* st = kvcm_cp_create_delegating(null_object ? NULL : &obj, null_out ? NULL : out);
	if (null_object) free(x);
	return st;
}
*/
import "C"

import (
	"math"
	"sync"
	"unsafe"
)

// CP vtable slots, for TestIndex.Slots.
const (
	SlotPredict  = uint32(C.TI_PREDICT)
	SlotCached   = uint32(C.TI_CACHED)
	SlotAlloc    = uint32(C.TI_ALLOC)
	SlotFreed    = uint32(C.TI_FREED)
	SlotPriority = uint32(C.TI_PRIORITY)
	SlotDestroy  = uint32(C.TI_DESTROY)
	SlotsAll     = SlotPredict | SlotCached | SlotAlloc | SlotFreed | SlotPriority | SlotDestroy
)

// Priority modes of the test index.
const (
	PriorityReverse = int(C.TI_REVERSE)
	PriorityGarbage = int(C.TI_GARBAGE)
	// CachedAlwaysShort makes get_cp_cached_blocks always ask for one more
	// key than it was given room for.
	CachedAlwaysShort = int(C.TI_SHORT_NEEDED)
)

// TestIndex configures the C test index behind a delegating CP index.
type TestIndex struct {
	Slots      uint32  // which vtable slots are non-NULL
	Score      float64 // what predict_prefix_reuse writes
	Fail       bool    // every method slot returns nonzero
	Mode       int     // PriorityReverse, PriorityGarbage or CachedAlwaysShort
	NumCached  int     // how many keys get_cp_cached_blocks reports
	StructSize uint32  // the vtable's struct_size; 0 = sizeof
	ABIVersion int32   // the vtable's abi_version; 0 = KVCM_ABI_VERSION, negative = 0
	NilVtable  bool    // pass an object whose vtable is NULL
	NilObject  bool    // pass NULL for the object
	NilOut     bool    // pass NULL for out
}

// vtables keeps the C vtables alive (the library borrows them until destroy).
var vtables struct {
	mu  sync.Mutex
	all []unsafe.Pointer
}

// CPCreateDelegating calls kvcm_cp_create_delegating with a C test index.
func CPCreateDelegating(ti TestIndex) (uint64, error) {
	abi := C.uint32_t(C.KVCM_ABI_VERSION)
	switch {
	case ti.ABIVersion < 0:
		abi = 0
	case ti.ABIVersion > 0:
		abi = C.uint32_t(ti.ABIVersion)
	}
	var vt *C.kvcm_cp_index_vtable
	if !ti.NilVtable {
		vt = C.ti_vtable(C.uint(ti.Slots), C.uint32_t(ti.StructSize), abi)
		vtables.mu.Lock()
		vtables.all = append(vtables.all, unsafe.Pointer(vt))
		vtables.mu.Unlock()
	}
	fail := 0
	if ti.Fail {
		fail = 1
	}
	null := 0
	if ti.NilObject {
		null = 1
	}
	nullOut := 0
	if ti.NilOut {
		nullOut = 1
	}
	var out C.kvcm_cp_index
	err := status(C.ti_create(vt, C.double(ti.Score), C.int(fail), C.int(ti.Mode), C.size_t(ti.NumCached), C.int(null), C.int(nullOut), &out))
	return uint64(out), err
}

// TestIndexStats are the C test index's global counters.
type TestIndexStats struct {
	Destroyed, Predicts, CachedCalls, AllocCalls, AllocKeys, FreedCalls, FreedKeys, PriorityCalls int64
	LastID                                                                                        string
}

// GetTestIndexStats reads the counters.
func GetTestIndexStats() TestIndexStats {
	return TestIndexStats{
		Destroyed: int64(C.ti_get(&C.ti_destroyed)), Predicts: int64(C.ti_get(&C.ti_predicts)),
		CachedCalls: int64(C.ti_get(&C.ti_cached_calls)), AllocCalls: int64(C.ti_get(&C.ti_alloc_calls)),
		AllocKeys: int64(C.ti_get(&C.ti_alloc_keys)), FreedCalls: int64(C.ti_get(&C.ti_freed_calls)),
		FreedKeys: int64(C.ti_get(&C.ti_freed_keys)), PriorityCalls: int64(C.ti_get(&C.ti_priority_calls)),
		LastID: C.GoString(&C.ti_last_id[0]),
	}
}

// Sub returns s - o (LastID from s).
func (s TestIndexStats) Sub(o TestIndexStats) TestIndexStats {
	return TestIndexStats{
		Destroyed: s.Destroyed - o.Destroyed, Predicts: s.Predicts - o.Predicts, CachedCalls: s.CachedCalls - o.CachedCalls,
		AllocCalls: s.AllocCalls - o.AllocCalls, AllocKeys: s.AllocKeys - o.AllocKeys, FreedCalls: s.FreedCalls - o.FreedCalls,
		FreedKeys: s.FreedKeys - o.FreedKeys, PriorityCalls: s.PriorityCalls - o.PriorityCalls, LastID: s.LastID,
	}
}

// CPCreateNull calls kvcm_cp_create_null.
func CPCreateNull() (uint64, error) {
	var out C.kvcm_cp_index
	err := status(C.kvcm_cp_create_null(&out))
	return uint64(out), err
}

// CPCreateManagerBacked calls kvcm_cp_create_manager_backed.
func CPCreateManagerBacked(m uint64, weights []float64, lora int64) (uint64, error) {
	var a arena
	defer a.free()
	o := (*C.kvcm_cp_manager_backed_options)(a.alloc(C.sizeof_kvcm_cp_manager_backed_options))
	o.struct_size, o.abi_version = C.sizeof_kvcm_cp_manager_backed_options, C.KVCM_ABI_VERSION
	ws := cArray[C.double](&a, len(weights))
	for i, w := range weights {
		ws[i] = C.double(w)
	}
	if len(ws) > 0 {
		o.level_weights, o.num_level_weights = &ws[0], C.size_t(len(ws))
	}
	o.scope.lora_id = C.int64_t(lora)
	var out C.kvcm_cp_index
	err := status(C.kvcm_cp_create_manager_backed(C.kvcm_manager(m), o, &out))
	return uint64(out), err
}

// CPDestroy calls kvcm_cp_destroy.
func CPDestroy(cp uint64) error { return status(C.kvcm_cp_destroy(C.kvcm_cp_index(cp))) }

// CPPredict calls kvcm_cp_predict_prefix_reuse.
func CPPredict(cp uint64, id string, tokens []int32) (float64, error) {
	var a arena
	defer a.free()
	p, n := idArg(&a, id)
	toks := cArray[C.kvcm_token](&a, len(tokens))
	for i, t := range tokens {
		toks[i] = C.kvcm_token(t)
	}
	var tp *C.kvcm_token
	if len(toks) > 0 {
		tp = &toks[0]
	}
	out := C.double(math.NaN())
	err := status(C.kvcm_cp_predict_prefix_reuse(C.kvcm_cp_index(cp), p, n, tp, C.size_t(len(tokens)), &out))
	return float64(out), err
}

func idArg(a *arena, id string) (*C.char, C.size_t) {
	if id == "" {
		return nil, 0
	}
	return a.str(id), C.size_t(len(id))
}

// CPCachedBlocks calls kvcm_cp_get_cached_blocks with a buffer of capacity
// keys (NULL when capacity is 0).
func CPCachedBlocks(cp uint64, id string, capacity int) ([]uint64, int, error) {
	var a arena
	defer a.free()
	p, n := idArg(&a, id)
	buf := cArray[C.uint64_t](&a, capacity)
	var bp *C.uint64_t
	if capacity > 0 {
		bp = &buf[0]
	}
	var needed C.size_t
	err := status(C.kvcm_cp_get_cached_blocks(C.kvcm_cp_index(cp), p, n, bp, C.size_t(capacity), &needed))
	if err != nil || capacity == 0 {
		return nil, int(needed), err
	}
	out := make([]uint64, needed)
	for i := range out {
		out[i] = uint64(buf[i])
	}
	return out, int(needed), nil
}

func keysArg(a *arena, keys []uint64) (*C.uint64_t, C.size_t) {
	ks := cArray[C.uint64_t](a, len(keys))
	for i, k := range keys {
		ks[i] = C.uint64_t(k)
	}
	if len(ks) == 0 {
		return nil, 0
	}
	return &ks[0], C.size_t(len(ks))
}

// CPNotifyAllocated calls kvcm_cp_notify_blocks_allocated.
func CPNotifyAllocated(cp uint64, id string, keys []uint64) error {
	var a arena
	defer a.free()
	p, n := idArg(&a, id)
	kp, kn := keysArg(&a, keys)
	return status(C.kvcm_cp_notify_blocks_allocated(C.kvcm_cp_index(cp), p, n, kp, kn))
}

// CPNotifyFreed calls kvcm_cp_notify_blocks_freed.
func CPNotifyFreed(cp uint64, id string, keys []uint64) error {
	var a arena
	defer a.free()
	p, n := idArg(&a, id)
	kp, kn := keysArg(&a, keys)
	return status(C.kvcm_cp_notify_blocks_freed(C.kvcm_cp_index(cp), p, n, kp, kn))
}

// CPPriority calls kvcm_cp_get_allocation_priority.
func CPPriority(cp uint64, ids []string) ([]int, error) {
	var a arena
	defer a.free()
	arr := cArray[C.kvcm_cp_request_id](&a, len(ids))
	for i, id := range ids {
		arr[i].data, arr[i].len = idArg(&a, id)
	}
	order := cArray[C.size_t](&a, len(ids))
	var ap *C.kvcm_cp_request_id
	var op *C.size_t
	if len(ids) > 0 {
		ap, op = &arr[0], &order[0]
	}
	if err := status(C.kvcm_cp_get_allocation_priority(C.kvcm_cp_index(cp), ap, C.size_t(len(ids)), op)); err != nil {
		return nil, err
	}
	out := make([]int, len(ids))
	for i := range out {
		out[i] = int(order[i])
	}
	return out, nil
}

// CPFaults calls kvcm_cp_get_fault_count.
func CPFaults(cp uint64) (uint64, error) {
	var out C.uint64_t
	err := status(C.kvcm_cp_get_fault_count(C.kvcm_cp_index(cp), &out))
	return uint64(out), err
}

// AttachCP calls kvcm_manager_attach_cp.
func AttachCP(m, cp uint64) error {
	return status(C.kvcm_manager_attach_cp(C.kvcm_manager(m), C.kvcm_cp_index(cp)))
}

// DetachCP calls kvcm_manager_detach_cp.
func DetachCP(m uint64) error { return status(C.kvcm_manager_detach_cp(C.kvcm_manager(m))) }

// CreateCacheForRequest calls kvcm_kv_cache_create with a request id
// (structSize 0 = sizeof; a smaller one omits the request id fields).
func CreateCacheForRequest(m uint64, id string, tokens []int32, structSize uint32) (uint64, error) {
	var a arena
	defer a.free()
	o := (*C.kvcm_kv_cache_options)(a.alloc(C.sizeof_kvcm_kv_cache_options))
	o.struct_size, o.abi_version = C.sizeof_kvcm_kv_cache_options, C.KVCM_ABI_VERSION
	if structSize != 0 {
		o.struct_size = C.uint32_t(structSize)
	}
	toks := cArray[C.kvcm_token](&a, len(tokens))
	for i, t := range tokens {
		toks[i] = C.kvcm_token(t)
	}
	if len(toks) > 0 {
		o.input_tokens, o.num_input_tokens = &toks[0], C.size_t(len(toks))
	}
	o.request_id, o.request_id_len = idArg(&a, id)
	var c C.kvcm_kv_cache
	err := status(C.kvcm_kv_cache_create(C.kvcm_manager(m), o, &c))
	return uint64(c), err
}

// KVCacheOptionsSizeWithoutRequestID is a struct_size of
// kvcm_kv_cache_options that stops before the request id (smaller than the
// version-1 size).
const KVCacheOptionsSizeWithoutRequestID = uint32(unsafe.Offsetof(C.kvcm_kv_cache_options{}.request_id))

// CPPriorityNullID calls kvcm_cp_get_allocation_priority with one request id
// whose data is NULL but whose len is 3.
func CPPriorityNullID(cp uint64) error {
	var a arena
	defer a.free()
	arr := cArray[C.kvcm_cp_request_id](&a, 1)
	arr[0].len = 3
	order := cArray[C.size_t](&a, 1)
	return status(C.kvcm_cp_get_allocation_priority(C.kvcm_cp_index(cp), &arr[0], 1, &order[0]))
}

// CPPredictNullID calls kvcm_cp_predict_prefix_reuse with a NULL request id
// of length 3.
func CPPredictNullID(cp uint64) error {
	var out C.double
	return status(C.kvcm_cp_predict_prefix_reuse(C.kvcm_cp_index(cp), nil, 3, nil, 0, &out))
}
