package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"fmt"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

func glueManagerGetAggregatedPages(mgr *managerObj, buffers *C.kvcm__const_kvcm_buffer_id, numBuffers C.size_t,
	descs *C.kvcm_aggregated_page_desc, descsCap C.size_t, members *C.kvcm_expanded_buffer, membersCap C.size_t,
	numDescs *C.size_t) error {
	in, err := cArray(buffers, numBuffers, "buffers")
	if err != nil {
		return err
	}
	keys := make([]layout.BufferKey, len(in))
	pos := make(map[layout.BufferKey]int, len(in))
	for i, b := range in {
		if b.role == nil {
			return argError(fmt.Sprintf("buffers[%d].role", i), "is NULL")
		}
		keys[i] = layout.BufferKey{Layer: int32(b.layer_id), Role: config.DataRole(C.GoString(b.role))}
		if _, dup := pos[keys[i]]; !dup {
			pos[keys[i]] = i
		}
	}
	ds, err := mgr.Core().AggregatedPages(keys)
	if err != nil {
		return err
	}
	*numDescs = C.size_t(len(ds))
	if descs == nil && members == nil && descsCap == 0 && membersCap == 0 {
		return nil
	}
	cd, err := cSlice(descs, descsCap, "descs_cap")
	if err != nil {
		return err
	}
	cm, err := cSlice(members, membersCap, "members_cap")
	if err != nil {
		return err
	}
	if uint64(descsCap) < uint64(len(ds)) || uint64(membersCap) < uint64(len(keys)) {
		return errorf(codeBufferTooSmall, "need %d descriptors and %d members; got room for %d and %d",
			len(ds), len(keys), uint64(descsCap), uint64(membersCap))
	}
	mi := 0
	for i, d := range ds {
		cd[i] = C.kvcm_aggregated_page_desc{
			base: C.kvcm_device_ptr(d.Base), size: C.int64_t(d.Size), stride: C.int64_t(d.Stride),
			layer_group: C.kvcm_layer_group_id(d.LayerGroup), buffers: &cm[mi], num_buffers: C.size_t(len(d.Buffers)),
		}
		for _, b := range d.Buffers {
			cm[mi] = C.kvcm_expanded_buffer{buffer: C.size_t(pos[b.Buffer]), expansion: C.int32_t(b.Expansion)}
			mi++
		}
	}
	return nil
}

func glueManagerGetPageIndexConverter(mgr *managerObj, layerID C.int32_t, role config.DataRole) (core.PageIndexConverter, error) {
	return mgr.Core().PageIndexConverter(int32(layerID), role)
}

func glueManagerGetPageStride(mgr *managerObj, layerID C.int32_t, role config.DataRole) (int64, error) {
	loc, err := mgr.Core().Buffer(int32(layerID), role)
	if err != nil {
		return 0, err
	}
	return loc.PageStride(), nil
}

func glueManagerGetPageIndexUpperBound(mgr *managerObj, layerID C.int32_t, role config.DataRole) (int64, error) {
	return mgr.Core().PageIndexUpperBound(int32(layerID), role)
}

func glueKVCacheGetAggregatedPageIndices(c *kvCacheObj, lg C.kvcm_layer_group_id, beam C.int32_t, validOnly C.bool) ([]int32, error) {
	return c.Core().AggregatedPageIndices(layout.LayerGroupID(lg), int(beam), bool(validOnly))
}
