package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"github.com/kvcm/kvcm/core/abimodel"
)

func glueKVCacheCreate(mgr *managerObj, opts *C.kvcm__const_kvcm_kv_cache_options, out *C.kvcm_kv_cache) error {
	ko, err := fromCKVCacheOptions((*C.kvcm_kv_cache_options)(opts), "options")
	if err != nil {
		return err
	}
	o, err := ko.Resolve()
	if err != nil {
		return err
	}
	obj := &kvCacheObj{}
	o.OnOpen = func(c *abimodel.Cache) { obj.Cache, obj.handle = c, newHandle(obj) }
	o.OnClose = func() { deleteHandle(obj.handle) }
	if _, err := mgr.CreateCache(o); err != nil {
		return err
	}
	*out = C.kvcm_kv_cache(obj.handle)
	return nil
}

func glueKVCacheClose(c *kvCacheObj) error {
	// The handle is consumed: exactly one of concurrent closes (or the
	// manager's destroy, through OnClose) frees it.
	if !deleteHandle(c.handle) {
		return errorf(codeInvalidHandle, "cache: %#x was closed concurrently (by kvcm_kv_cache_close or kvcm_manager_destroy)", c.handle)
	}
	return c.Close()
}
