package abimodel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/layout"
)

// NoSharedLevel is what SharedLevel reports for a manager without a shared
// tier.
const NoSharedLevel layout.CacheLevel = -1

// SharedLevel returns the shared tier's level number (the number of local
// levels: the level events name for a page onboarded from the shared tier),
// or NoSharedLevel without a shared tier; it fails with core.ErrClosed once
// closed.
func (mgr *Manager) SharedLevel() (layout.CacheLevel, error) {
	if err := mgr.open(); err != nil {
		return 0, err
	}
	if l, ok := mgr.m.SharedLevel(); ok {
		return l, nil
	}
	return NoSharedLevel, nil
}

// SharedStats returns the shared tier's counters (see core.SharedStats). It
// fails with core.ErrInvalidState without a shared tier and with
// core.ErrClosed once closed.
func (mgr *Manager) SharedStats() (core.SharedStats, error) {
	if err := mgr.open(); err != nil {
		return core.SharedStats{}, err
	}
	s, ok := mgr.m.SharedStats()
	if !ok {
		return s, fmt.Errorf("%w: the manager has no shared tier", core.ErrInvalidState)
	}
	return s, nil
}

// FlushShared waits at most timeoutMs milliseconds for the shared tier's
// writes handed over so far (see core.Manager.FlushShared) and reports
// whether they were all written or failed in time: false when the timeout
// ran out first, the writes going on. Without a shared tier it reports true
// at once. A timeout that is not positive is an error naming timeout_ms; it
// fails with core.ErrClosed once closed.
func (mgr *Manager) FlushShared(timeoutMs int64) (bool, error) {
	if timeoutMs <= 0 {
		return false, argErr("timeout_ms", "is %d, must be positive", timeoutMs)
	}
	if err := mgr.open(); err != nil {
		return false, err
	}
	timeout := time.Duration(math.MaxInt64) // saturating: a huge timeout stays positive
	if timeoutMs < math.MaxInt64/int64(time.Millisecond) {
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := mgr.m.FlushShared(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return false, nil
	}
	return err == nil, err
}
