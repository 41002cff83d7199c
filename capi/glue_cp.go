package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
*/
import "C"

import (
	"unsafe"

	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/blockhash"
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
	hasLoRA := fieldPresent(opts.struct_size, unsafe.Offsetof(opts.scope_has_lora_id), unsafe.Sizeof(opts.scope_has_lora_id)) && bool(opts.scope_has_lora_id)
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

// ---- Delegating: abimodel.ExternalCP over a C vtable ----

// cpIndexObjectArg is a CP index object taken from a caller: its slots as
// an abimodel.ExternalCP (goCallerCPIndexVtable), or the error found while
// taking it. The shim takes it first and releases it on return, so the
// object is either handed on or destroyed.
type cpIndexObjectArg struct {
	ext    abimodel.ExternalCP
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
	a.ext = goCallerCPIndexVtable(vt, C.kvcm__get_cp_index_object_self(p))
	a.err = checkCPIndexVtable(vt, "object.vtable")
	return a
}

func (a *cpIndexObjectArg) release() {
	if !a.handed && a.ext.Destroy != nil {
		a.ext.Destroy()
	}
}

func glueCPCreateDelegating(a *cpIndexObjectArg, out *C.kvcm_cp_index) error {
	if a.err != nil {
		return a.err
	}
	a.handed = true
	return newCPObj(abimodel.NewExternalIndex(a.ext), out)
}

// ---- Wiring a manager to an index ----

func glueManagerAttachCP(mgr *managerObj, o *cpObj) error { return mgr.AttachCP(o.CPIndex) }
