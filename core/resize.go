package core

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// Quota returns the byte quota of a cache level.
func (m *Manager) Quota(level layout.CacheLevel) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lvl, err := m.level(level)
	if err != nil {
		return 0, err
	}
	return lvl.quota, nil
}

// ResizeLevel changes the byte quota of a cache level. The new quota is shared
// among the level's pool groups by the layer-group weights, as at
// construction (constraint floors on the GPU level only). Shrinking evicts
// what no longer fits, defragments the survivors into the slots that remain
// and releases the rest; growing adds slots. GPU pools grow and shrink in
// place within cache_tiers[0].max_quota, so base addresses and the page
// indices of ACTIVE caches stay valid; pages that ACTIVE caches pin in slots
// beyond the new size make shrinking fail. On error nothing was released
// (evicted pages may have moved to colder levels).
func (m *Manager) ResizeLevel(level layout.CacheLevel, quota int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	lvl, err := m.level(level)
	if err != nil {
		return err
	}
	if quota <= 0 {
		return argErr("quota", "must be positive, got %d", quota)
	}
	m.settle()
	target, err := m.slotsFor(lvl, quota)
	if err != nil {
		return err
	}
	if lvl.index == 0 {
		quota = m.lt.HotQuota(quota, m.lt.HotFloors(&m.cfg)) // whole granules
	}
	return m.resizeLevel(lvl, quota, target)
}

// resizeLevel gives the pool groups of lvl target slots and the level
// quota: the work of ResizeLevel and Adjust.
func (m *Manager) resizeLevel(lvl *storageLevel, quota int64, target []int64) error {
	if err := m.checkShrink(lvl, target); err != nil {
		return err
	}
	for i, g := range lvl.groups {
		if target[i] < g.numSlots {
			if err := m.reserveAt(lvl.index, need{{g, int(g.numSlots - target[i])}}); err != nil {
				return fmt.Errorf("resize %v level to %d bytes: %w", lvl.kind, quota, err)
			}
		}
	}
	sizes := make([]int64, len(lvl.groups)) // each group's size before it was resized
	// Defragmenting hides the slots that will go from the free lists; on
	// any failure from here on they come back.
	fail := func(err error) error {
		for _, g := range lvl.groups {
			g.rebuildFree()
		}
		m.safePoint()
		return fmt.Errorf("resize %v level to %d bytes: %w", lvl.kind, quota, err)
	}
	for i, g := range lvl.groups {
		if target[i] < g.numSlots {
			if err := m.defragment(g, target[i]); err != nil {
				return fail(fmt.Errorf("defragment: %w", err))
			}
		}
	}
	if err := m.drainLevel(lvl); err != nil {
		return fail(err)
	}
	for i, g := range lvl.groups {
		before := g.numSlots
		if err := m.resizeGroup(g, target[i]); err != nil {
			// Groups already resized go back: a failed call changes nothing.
			for j := range i {
				m.resizeGroup(lvl.groups[j], sizes[j])
			}
			if errors.Is(err, device.ErrOutOfMemory) {
				err = fmt.Errorf("%w: %w", ErrOutOfPages, err)
			}
			return fail(err)
		}
		sizes[i] = before
	}
	lvl.quota = quota
	m.safePoint()
	return nil
}

// slotsFor shares quota among the level's groups by its current weights.
func (m *Manager) slotsFor(lvl *storageLevel, quota int64) ([]int64, error) {
	return m.slotsBy(lvl, quota, m.rebalance.weights[lvl.index])
}

// slotsBy shares quota among the level's groups by the layer groups' byte
// weights.
func (m *Manager) slotsBy(lvl *storageLevel, quota int64, weights []float64) ([]int64, error) {
	var slots []int64
	var err error
	if lvl.index == 0 {
		slots, err = m.lt.HotSlots(quota, weights, m.lt.HotFloors(&m.cfg))
	} else {
		slots, err = m.lt.ColdSlots(lvl.index, quota, weights)
	}
	if err != nil {
		return nil, argErr("quota", "%v", err)
	}
	for i, g := range lvl.groups {
		if lvl.index == 0 && slots[i] > g.capacity {
			return nil, argErr("quota", "%d bytes needs %d slots in gpu pool group %d, which reserved %d (raise cache_tiers[0].max_quota)",
				quota, slots[i], g.desc.Index, g.capacity)
		}
	}
	return slots, nil
}

// checkShrink fails, changing nothing, when a group cannot get down to its
// target: too many slots are neither free nor evictable, or (on the GPU) an
// ACTIVE cache pins a page in a slot that would go.
func (m *Manager) checkShrink(lvl *storageLevel, target []int64) error {
	for i, g := range lvl.groups {
		if target[i] >= g.numSlots {
			continue
		}
		if busy := g.used() - int64(g.victims.len()); busy > target[i] {
			return fmt.Errorf("%w: %v pool group %d has %d busy slots, more than the %d it would keep",
				ErrOutOfPages, lvl.kind, g.desc.Index, busy, target[i])
		}
		for s := target[i]; s < g.numSlots; s++ {
			if p := g.owner[s]; p != nil && (p.active > 0 || p.moving) {
				return fmt.Errorf("%w: an active cache pins slot %d of %v pool group %d, beyond the new size %d",
					ErrInvalidState, s, lvl.kind, g.desc.Index, target[i])
			}
		}
	}
	return nil
}

// defragment moves the pages in slots at or beyond keep into free slots
// below it, on the same level.
func (m *Manager) defragment(g *slotGroup, keep int64) error {
	g.free.dropFrom(keep)
	var movers []*page
	for s := keep; s < g.numSlots; s++ {
		if p := g.owner[s]; p != nil {
			movers = append(movers, p)
		}
	}
	err := m.migrate(movers, g.level.index)
	g.free.dropFrom(keep)
	return err
}

// drainLevel waits until no work touches the level's memory.
func (m *Manager) drainLevel(lvl *storageLevel) error {
	for _, st := range m.migrationStreams() {
		if err := st.Synchronize(); err != nil {
			return fmt.Errorf("drain migration streams: %w", err)
		}
	}
	waits := waitSet{}
	for _, g := range lvl.groups {
		for _, f := range g.fences {
			waits.addFence(f)
		}
	}
	waits.synchronize() // failures were reported to whoever recorded them
	m.settle()
	return nil
}

// rebuildFree makes every unowned slot free again.
func (g *slotGroup) rebuildFree() {
	g.free.reset(g.numSlots)
	for s := range int32(g.numSlots) {
		if g.owner[s] == nil {
			g.free.put(s)
		}
	}
}

// resizeGroup gives g exactly slots slots; the slots beyond it are free. On
// error g is unchanged.
func (m *Manager) resizeGroup(g *slotGroup, slots int64) error {
	if slots == g.numSlots {
		return nil
	}
	keep := min(slots, g.numSlots)
	switch {
	case g.onDisk():
		if err := g.reserveFile(slots); err != nil {
			return err
		}
		g.capacity = slots
	case g.level.index == 0:
		for i, mem := range g.mem {
			size, err := slotsBytes(slots, g.desc.PoolBytes[i])
			if err == nil {
				err = mem.(device.Growable).Resize(size)
			}
			if err != nil {
				for j := range i { // every pool keeps the group's slot count
					g.mem[j].(device.Growable).Resize(g.numSlots * g.desc.PoolBytes[j])
				}
				return err
			}
		}
	default:
		size, err := slotsBytes(slots, g.blobBytes())
		if err != nil {
			return err
		}
		mem, err := m.dev.Alloc(device.HostMapped, size)
		if err != nil {
			return err
		}
		copy(mem.Host(), g.mem[0].Host()[:keep*g.blobBytes()])
		g.mem[0].Free()
		g.mem[0] = mem
		g.capacity = slots
	}
	for _, f := range g.fences[keep:] {
		for _, e := range f {
			m.events.release(e)
		}
	}
	owner := make([]*page, slots)
	copy(owner, g.owner[:keep])
	fences := newFences(slots)
	copy(fences, g.fences[:keep])
	g.owner, g.fences, g.numSlots = owner, fences, slots
	var free freeSlots
	free.reset(slots)
	g.free.each(func(s int32) {
		if int64(s) < keep {
			free.put(s)
		}
	})
	for s := keep; s < slots; s++ {
		free.put(int32(s))
	}
	g.free = free
	g.peakUsed = min(g.peakUsed, slots)
	g.peakAvail, g.peakUnavail, g.peakEvictable = min(g.peakAvail, slots), min(g.peakUnavail, slots), min(g.peakEvictable, slots)
	return nil
}
