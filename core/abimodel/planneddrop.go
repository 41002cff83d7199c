package abimodel

import (
	"errors"

	"github.com/kvcm/kvcm/core"
)

// DestroyPlannedDrop ends a plan whose handle goes
// (kvcm_planned_drop_destroy): a plan not carried out yet is carried out
// now, as KVCacheManagerV2 does when its handle goes, unless its manager
// was closed, which left nothing to drop.
func DestroyPlannedDrop(d *core.PlannedDrop) error {
	if d.Dropped() {
		return nil
	}
	if err := d.Drop(); err != nil && !errors.Is(err, core.ErrClosed) {
		return err
	}
	return nil
}
