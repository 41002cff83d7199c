package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"github.com/kvcm/kvcm/core/abimodel"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

func glueManagerGetAggregatedPages(mgr *managerObj, buffers []layout.BufferKey) ([]abimodel.AggregatedPage, error) {
	return mgr.AggregatedPages(buffers)
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
