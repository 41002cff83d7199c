package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"errors"
	"math"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// SWA scratch reuse, planned drops and pool rebalancing (issue 13 items 4
// and 6).

func glueKVCacheGetScratchDesc(c *kvCacheObj, lg C.kvcm_layer_group_id, begin, end *C.int64_t, slots *C.int32_t, capacity C.size_t, needed *C.size_t) error {
	d, err := c.Core().ScratchDesc(layout.LayerGroupID(lg))
	if err != nil {
		return err
	}
	*begin, *end = C.int64_t(d.Begin), C.int64_t(d.End)
	return fill(d.Slots, slots, capacity, needed, func(s int32) C.int32_t { return C.int32_t(s) })
}

func glueKVCacheHasScratchSlots(c *kvCacheObj, out *C.bool) error {
	*out = C.bool(c.Core().HasScratchSlots())
	return nil
}

func glueKVCacheGetSwaScratchReuse(c *kvCacheObj, out *C.bool) error {
	*out = C.bool(c.Core().SwaScratchReuse())
	return nil
}

func glueKVCacheSetSwaScratchReuse(c *kvCacheObj, enable C.bool) error {
	return c.Core().SetSwaScratchReuse(bool(enable))
}

func glueKVCachePlanCommittedBlockDrop(c *kvCacheObj, out *C.kvcm_planned_drop) error {
	d, err := c.Core().PlanCommittedBlockDrop()
	if err != nil || d == nil {
		return err
	}
	o := &plannedDropObj{PlannedDrop: d}
	o.handle = newHandle(o)
	*out = C.kvcm_planned_drop(o.handle)
	return nil
}

func gluePlannedDropDrop(d *plannedDropObj) error { return d.Drop() }

func gluePlannedDropDestroy(d *plannedDropObj) error {
	if !deleteHandle(d.handle) {
		return errorf(codeInvalidHandle, "drop: %#x was destroyed concurrently", d.handle)
	}
	if d.Dropped() {
		return nil
	}
	if err := d.Drop(); err != nil && !errors.Is(err, core.ErrClosed) {
		return err
	}
	return nil
}

func glueManagerGetScratchPagesPerBlock(mgr *managerObj, layerID C.int32_t, role *C.kvcm__const_char, out *C.int64_t) error {
	loc, err := mgr.Core().Buffer(int32(layerID), config.DataRole(C.GoString(role)))
	if err != nil {
		return err
	}
	*out = C.int64_t(loc.ScratchPagesPerBlock)
	return nil
}

func glueManagerNeedAdjustment(mgr *managerObj, out *C.bool) error {
	*out = C.bool(mgr.Core().NeedAdjustment())
	return nil
}

func glueManagerAdjust(mgr *managerObj) error { return mgr.Core().Adjust() }

func glueManagerClampMaxSeqLenForMem(mgr *managerObj, batchSize, upperBound C.int64_t, out *C.int64_t) error {
	if int64(batchSize) > math.MaxInt32 {
		return argError("batch_size", "%d is out of range (at most %d)", int64(batchSize), math.MaxInt32)
	}
	n, err := mgr.Core().ClampMaxSeqLenForMem(int(batchSize), int(upperBound))
	if err != nil {
		return err
	}
	*out = C.int64_t(n)
	return nil
}
