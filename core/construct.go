package core

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/core/staging"
)

// WithColdPageCodec hands the manager a codec. NewManager takes it as its
// first act, so it is consumed whether construction succeeds or fails, and
// destroyed on failure. Without this option the manager creates the default
// lossless concatenating codec.
func WithColdPageCodec(c *codec.Owned) Option { return func(o *options) { o.codec = c } }

// ErrCodecRejected: the codec rejected the configuration or reported values
// the manager cannot use.
var ErrCodecRejected = errors.New("cold-page codec rejected")

// codecWhy says how a codec call that returned its failure value failed:
// by returning it, or by panicking (the guard recovered).
func (m *Manager) codecWhy() string {
	if p := m.codec.TakePanic(); p != nil {
		return fmt.Sprintf("panicked: %v", p.Value)
	}
	return "returned false"
}

// lcCodec is what the codec reported for one lifecycle, validated.
type lcCodec struct {
	coldBytes int64
	rep       layout.LayerGroupID
	loc       codec.PageIndexLocation
}

// configureCodec runs steps 3 to 5 of the design's initialization order:
// configure the codec with the hot descriptors, query every lifecycle,
// validate the batching classes, and build the cold grouping.
func (m *Manager) configureCodec() error {
	if !m.codec.Configure(m.hotDescs()) {
		return fmt.Errorf("%w: Configure %s", ErrCodecRejected, m.codecWhy())
	}
	lcs := make([]layout.LayerGroupID, len(m.lt.LifeCycles))
	for i := range lcs {
		lcs[i] = layout.LayerGroupID(i)
	}
	infos, err := codec.QueryAll(m.codec, lcs)
	if err != nil {
		if p := m.codec.TakePanic(); p != nil {
			return fmt.Errorf("%w: %w (%w)", ErrCodecRejected, err, p)
		}
		return fmt.Errorf("%w: %w", ErrCodecRejected, err)
	}
	m.lcCodec = make([]lcCodec, len(infos))
	cold := make([]int64, len(infos))
	for i, in := range infos {
		m.lcCodec[i] = lcCodec{coldBytes: in.ColdPageBytes, rep: in.BatchingID, loc: in.Location}
		cold[i] = in.ColdPageBytes
	}
	if err := m.lt.SetColdPageBytes(cold); err != nil {
		return fmt.Errorf("%w: %v", ErrCodecRejected, err)
	}
	return m.validateBatching()
}

// validateBatching checks every batching representative: configured, no
// greater than its members, its own representative, in the same hot and cold
// pool groups, with the same cold-page size and index location.
func (m *Manager) validateBatching() error {
	hot := &m.lt.Levels[0]
	for lc, info := range m.lcCodec {
		rep := info.rep
		fail := func(format string, args ...any) error {
			return fmt.Errorf("%w: lifecycle %d: batching representative %d %s",
				ErrCodecRejected, lc, rep, fmt.Sprintf(format, args...))
		}
		switch {
		case int(rep) >= len(m.lcCodec):
			return fail("is not a configured lifecycle")
		case int(rep) > lc:
			return fail("is greater than its member")
		case m.lcCodec[rep].rep != rep:
			return fail("maps to %d, not to itself", m.lcCodec[rep].rep)
		case hot.LifeCycleToGroup[rep] != hot.LifeCycleToGroup[lc]:
			return fail("is in hot pool group %d, its member in %d", hot.LifeCycleToGroup[rep], hot.LifeCycleToGroup[lc])
		case m.lcCodec[rep].coldBytes != info.coldBytes:
			return fail("has cold pages of %d bytes, its member %d", m.lcCodec[rep].coldBytes, info.coldBytes)
		case m.lcCodec[rep].loc != info.loc:
			return fail("uses %v indices, its member %v", m.lcCodec[rep].loc, info.loc)
		}
		// Equal cold sizes put both in one cold pool group on every level.
	}
	return nil
}

// initColdLevels allocates every cold tier with its one-pool groups, sized by
// projecting the layer-group byte weights through slot counts.
func (m *Manager) initColdLevels(weights []float64) error {
	for i := 1; i < len(m.cfg.CacheTiers); i++ {
		tier := m.cfg.CacheTiers[i]
		slots, err := m.lt.ColdSlots(i, tier.Quota, weights)
		if err != nil {
			return &config.Error{Field: fmt.Sprintf("cache_tiers[%d].quota", i), Msg: err.Error()}
		}
		lvl := &storageLevel{index: i, kind: tier.Kind, quota: tier.Quota, lcMap: m.lt.Levels[i].LifeCycleToGroup, nodes: &m.nodes}
		m.levels = append(m.levels, lvl)
		for gi, gl := range m.lt.Levels[i].Groups {
			var g *slotGroup
			if tier.Kind == config.DiskTier {
				g, err = newDiskGroup(lvl, gl, slots[gi], tier, m.cfg.TokensPerBlock, diskDigests(&m.cfg), m.diskFiles)
			} else {
				g, err = newSlotGroup(m.dev, lvl, gl, slots[gi], device.HostMapped)
			}
			if err != nil {
				return fmt.Errorf("cache_tiers[%d]: %w", i, err)
			}
			lvl.groups = append(lvl.groups, g)
		}
	}
	return nil
}

// initStaging creates the pinned page ring when a cold tier lives on disk and
// the (lazily allocated) device index ring when a codec uses device indices.
func (m *Manager) initStaging() error {
	var maxCold int64
	deviceIdx := false
	for _, c := range m.lcCodec {
		maxCold = max(maxCold, c.coldBytes)
		deviceIdx = deviceIdx || c.loc == codec.Device
	}
	if _, ok := m.cfg.Tier(config.DiskTier); ok {
		ring, err := staging.NewPageRing(m.dev, maxCold)
		if err != nil {
			return fmt.Errorf("page staging ring: %w", err)
		}
		m.pageRing = ring
	}
	if deviceIdx {
		ring, err := staging.NewIndexRing(m.dev, indexRingBytes)
		if err != nil {
			return fmt.Errorf("index staging ring: %w", err)
		}
		m.indexRing = ring
	}
	return nil
}

// indexRingBytes holds several maximal index batches, so the upload of one
// chunk overlaps the codec work of the previous ones.
const indexRingBytes = 4 * staging.MaxIndexBatchBytes
