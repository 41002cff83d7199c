package capi

/*
#include <stdlib.h>
#include <string.h>
#include "kvcm/kvcm.h"
#include "shim_generated.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/cp"
)

// ---- Creating indexes ----

// newCPObj issues the handle of a new index.
func newCPObj(x *abimodel.CPIndex, out *C.kvcm_cp_index) error {
	o := &cpObj{CPIndex: x}
	o.handle = newHandle(o)
	*out = C.kvcm_cp_index(o.handle)
	return nil
}

func glueCPCreateNull(out *C.kvcm_cp_index) error { return newCPObj(abimodel.NewNullIndex(), out) }

func glueCPDestroy(o *cpObj) error {
	if !deleteHandle(o.handle) {
		return errorf(codeInvalidHandle, "cp: %#x was destroyed concurrently", o.handle)
	}
	return o.Destroy()
}

func glueCPCreateManagerBacked(mgr *managerObj, opts *C.kvcm__const_kvcm_cp_manager_backed_options, out *C.kvcm_cp_index) error {
	o, err := fromCCPManagerBackedOptions((*C.kvcm_cp_manager_backed_options)(opts), "options")
	if err != nil {
		return err
	}
	hasLoRA := C.kvcm__has_cp_manager_backed_options_scope_has_lora_id(opts) != 0 && bool(opts.scope_has_lora_id)
	scope, err := fromCReuseScope(&opts.scope, "options.scope")
	if err != nil {
		return err
	}
	scope.HasLoRA = hasLoRA
	o.ScopeOf = func(string) blockhash.Scope { return scope }
	x, err := mgr.NewManagerBackedIndex(o)
	if err != nil {
		return err
	}
	return newCPObj(x, out)
}

// ---- Delegating: core/cp.External over a C vtable ----

// cCPIndex calls an external index through its vtable. A slot is used only
// when struct_size covers it and it is non-null.
type cCPIndex struct {
	vt        *C.kvcm_cp_index_vtable
	self      C.uintptr_t
	destroyed atomic.Bool
}

// close calls the destroy slot, exactly once.
func (c *cCPIndex) close() {
	if c.destroyed.CompareAndSwap(false, true) && C.kvcm__has_cp_index_vtable_destroy(c.vt) != 0 {
		C.kvcm__call_cp_index_vtable_destroy(c.vt, c.self)
	}
}

// cpIndexObjectArg is a CP index object taken from a caller: the adapter,
// or the error found while taking it. The shim takes it first and releases
// it on return, so the object is either handed on or destroyed.
type cpIndexObjectArg struct {
	ext    *cCPIndex
	handed bool
	err    error
}

func consumeCPIndexObject(p *C.kvcm__const_kvcm_cp_index_object) *cpIndexObjectArg {
	a := &cpIndexObjectArg{}
	if p == nil {
		a.err = argError("object", "must not be NULL")
		return a
	}
	vt := p.vtable
	if vt == nil {
		a.err = argError("object.vtable", "is NULL (the index cannot be destroyed)")
		return a
	}
	a.ext = &cCPIndex{vt: vt, self: C.kvcm__get_cp_index_object_self(p)}
	switch {
	case vt.abi_version == 0:
		a.err = argError("object.vtable.abi_version", "is 0: set it to KVCM_ABI_VERSION")
	case vt.struct_size < 8:
		a.err = argError("object.vtable.struct_size", "is %d, less than the 8 bytes of struct_size and abi_version", vt.struct_size)
	}
	return a
}

func (a *cpIndexObjectArg) release() {
	if a.ext != nil && !a.handed {
		a.ext.close()
	}
}

// external builds the External whose funcs are the vtable's present slots:
// goCallerCPIndexVtable calls all but get_allocation_priority, whose order
// of indices this adapter turns into ids.
func (c *cCPIndex) external() cp.External {
	vt, self := c.vt, c.self
	e := goCallerCPIndexVtable(vt, self)
	if C.kvcm__has_cp_index_vtable_get_allocation_priority(vt) != 0 {
		e.GetAllocationPriority = func(ids []string) ([]string, error) {
			if len(ids) == 0 {
				return ids, nil
			}
			arr, free, err := cRequestIDs(ids)
			if err != nil {
				return nil, err
			}
			defer free()
			order := make([]C.size_t, len(ids))
			for i := range order {
				order[i] = C.size_t(math.MaxUint64) // unwritten entries are dropped
			}
			rc := C.kvcm__call_cp_index_vtable_get_allocation_priority(vt, self, arr, C.size_t(len(ids)), &order[0])
			if err := slotError("get_allocation_priority", rc); err != nil {
				return nil, err
			}
			// Out-of-range indices become ids the input lacks; Delegating
			// drops them and appends what is missing.
			out := make([]string, 0, len(ids))
			for _, j := range order {
				if uint64(j) < uint64(len(ids)) {
					out = append(out, ids[j])
				} else {
					out = append(out, "\x00kvcm: invalid index")
				}
			}
			return out, nil
		}
	}
	return e
}

// errCOutOfMemory reports a failed C allocation.
var errCOutOfMemory = errors.New("out of C memory")

// cRequestIDs copies ids into one C allocation: the structs, then the bytes.
// A failed allocation is an error (the slot is then not called).
func cRequestIDs(ids []string) (*C.kvcm_cp_request_id, func(), error) {
	total := 0
	for _, id := range ids {
		total += len(id)
	}
	size := C.size_t(len(ids))*C.sizeof_kvcm_cp_request_id + C.size_t(total) + 1
	mem := C.calloc(1, size)
	if mem == nil {
		return nil, nil, fmt.Errorf("get_allocation_priority: copying %d request ids (%d bytes): %w", len(ids), uint64(size), errCOutOfMemory)
	}
	arr := unsafe.Slice((*C.kvcm_cp_request_id)(mem), len(ids))
	bytes := unsafe.Slice((*byte)(unsafe.Add(mem, len(ids)*C.sizeof_kvcm_cp_request_id)), total+1)
	off := 0
	for i, id := range ids {
		copy(bytes[off:], id)
		if len(id) > 0 {
			arr[i].data = (*C.char)(unsafe.Pointer(&bytes[off]))
		}
		arr[i].len = C.size_t(len(id))
		off += len(id)
	}
	return &arr[0], func() { C.free(mem) }, nil
}

func glueCPCreateDelegating(a *cpIndexObjectArg, out *C.kvcm_cp_index) error {
	if a.err != nil {
		return a.err
	}
	a.handed = true
	return newCPObj(abimodel.NewDelegatingIndex(a.ext.external(), a.ext.close), out)
}

// ---- The five methods on any index ----

func glueCPGetAllocationPriority(o *cpObj, ids []abimodel.RequestID) ([]int, error) {
	in := make([]string, len(ids))
	for i, id := range ids {
		in[i] = id.ID
	}
	return o.GetAllocationPriority(in)
}

// ---- Wiring a manager to an index ----

func glueManagerAttachCP(mgr *managerObj, o *cpObj) error { return mgr.AttachCP(o.CPIndex) }
