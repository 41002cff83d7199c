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

// SWA scratch reuse, planned drops and pool rebalancing (issue 13 items 4
// and 6).

// glueKVCachePlanCommittedBlockDrop returns the plan's handle, 0 when
// nothing is planned.
func glueKVCachePlanCommittedBlockDrop(c *kvCacheObj) (uint64, error) {
	d, err := c.Core().PlanCommittedBlockDrop()
	if err != nil || d == nil {
		return 0, err
	}
	o := &plannedDropObj{PlannedDrop: d}
	o.handle = newHandle(o)
	return o.handle, nil
}

func gluePlannedDropDestroy(d *plannedDropObj) error {
	if !deleteHandle(d.handle) {
		return errorf(codeInvalidHandle, "drop: %#x was destroyed concurrently", d.handle)
	}
	return abimodel.DestroyPlannedDrop(d.PlannedDrop)
}
