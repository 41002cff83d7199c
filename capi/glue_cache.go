package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"fmt"

	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/layout"
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
	co := &o.CacheOptions
	user := C.kvcm__get_kv_cache_options_priority_user_data(opts)
	var lgFn C.kvcm_layer_group_priority_func
	if C.kvcm__has_kv_cache_options_layer_group_priority(opts) != 0 {
		lgFn = opts.layer_group_priority
	}
	switch {
	case lgFn != nil && opts.priority != nil:
		return argError("options.layer_group_priority", "is set together with options.priority; set one of them")
	case lgFn != nil:
		co.Priority = func(block int, lc layout.LayerGroupID) int {
			var pr C.int32_t
			if rc := C.kvcm__call_layer_group_priority_func(lgFn, user, C.int64_t(block), C.kvcm_layer_group_id(lc), &pr); rc != 0 {
				// The core fails the commit, changing nothing, when the
				// priority function panics.
				panic(fmt.Sprintf("kvcm_layer_group_priority_func returned %d", int32(rc)))
			}
			return int(pr)
		}
	case opts.priority != nil:
		fn := opts.priority
		co.Priority = func(block int, _ layout.LayerGroupID) int {
			var pr C.int32_t
			if rc := C.kvcm__call_priority_func(fn, user, C.int64_t(block), &pr); rc != 0 {
				panic(fmt.Sprintf("kvcm_priority_func returned %d", int32(rc)))
			}
			return int(pr)
		}
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

func glueKVCacheResume(c *kvCacheObj, stream C.kvcm_stream) error {
	s, err := c.Manager().Stream(uintptr(stream))
	if err != nil {
		return err
	}
	return c.Resume(s)
}

func glueKVCacheSetStream(c *kvCacheObj, stream C.kvcm_stream) error {
	s, err := c.Manager().Stream(uintptr(stream))
	if err != nil {
		return err
	}
	return c.SetStream(s)
}
