// Package core is kvcm's Go API: a paged KV-cache manager with prefix reuse,
// eviction and (with cold tiers) migration, over the device interface.
//
// A Manager owns every page of every cache level. Engines create one KVCache
// per request with its prompt tokens; the cache starts SUSPENDED holding the
// longest reusable cached prefix (all of the prompt when all of it is cached,
// as in TensorRT-LLM's KVCacheManagerV2). Resume(stream) makes it ACTIVE on
// the engine's stream, Resize allocates pages for the tokens the next step
// computes, BasePageIndices tells the engine's kernels where the pages are,
// Commit publishes computed tokens for reuse and advances the history length
// to them, Suspend lets its pages be evicted, and Close releases it. With beam
// search, SetBeamWidth forks beams that share the prefix's pages,
// BasePageIndicesOfBeam gives each beam's pages, and CommitBeamSearch
// reorders the beams before committing their converged tokens.
//
// All methods of a Manager and of its caches are safe for concurrent use: one
// mutex per manager serializes them.
//
// Words: a tier is a configured kind of storage (config.CacheTierConfig, the
// design's cache_tiers); a level is a tier's place at run time
// (layout.CacheLevel, 0 the GPU): level i holds cache_tiers[i]. A layer group
// (layout.LayerGroupID) is the design's lifecycle. With SSM layers
// (config.SsmLayerConfig) one more layer group holds one state page per
// cache instead of a page per block: the cache gets it at its first Resume
// (a copy of the snapshot it reused, or a fresh page), SsmBlockBaseIndex
// locates it, and a Commit that ends on a block boundary snapshots it into
// that block, where reuse ends (KVCacheManagerV2's commit_min_snapshot).
//
// Files by job: manager.go and construct.go build and close the manager;
// kvcache.go is a cache's lifecycle; beam.go its beams (per-beam pages, copy
// on write, reorders); tree.go the radix tree and prefix
// matching; storage.go the levels, slot groups and page ownership; evict.go
// making room on a level; migrate.go the migration transactions; fence.go
// events and fences; slab.go the node store (pointer-free tree nodes by ID)
// and the page store (pages reused once freed); resize.go level resizes;
// rebalance.go pool rebalancing (NeedAdjustment, Adjust); scratch.go SWA
// scratch reuse; planneddrop.go planned drops of a finished turn's window
// pages; disktier.go, diskfile.go and persist.go the disk tier's I/O, files
// and persistence; sharedlevel.go the shared tier (Redis Cluster) beside the
// local levels; errors.go, events.go and stats.go what the manager reports.
package core

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/core/staging"
)

// Option configures NewManager.
type Option func(*options)

type options struct {
	dev       device.Device
	codec     *codec.Owned
	listeners []EventListener
	diskFiles DiskOpener
}

// WithDevice selects the device; by default the manager opens (and owns) the
// device configuration names: backend.Open(""), which reads KVCM_DEVICE and
// otherwise picks CUDA where a GPU is present and the emulation elsewhere.
func WithDevice(d device.Device) Option { return func(o *options) { o.dev = d } }

// Manager is a paged KV-cache manager.
type Manager struct {
	mu     sync.Mutex
	cfg    config.Config
	lt     *layout.Layout
	dev    device.Device
	ownDev bool
	// stream carries GPU→host evictions and the copies within a level,
	// upStream host→GPU onboardings, diskStreams the migrations that read or
	// write the disk tier, in turn (see streamOf): an eviction and an
	// onboarding overlap on a full-duplex bus, and one disk transaction's
	// encode overlaps another's file I/O. Only the slots' fences order them.
	stream   device.Stream
	upStream device.Stream
	// codecSerial: the codec does not declare codec.MultiStream, so its
	// calls are ordered across streams: each unit that calls it waits for
	// lastCodec, the finish event of the previous such unit. That event also
	// covers a disk unit's file I/O (a mid-unit event would split the unit's
	// failure interval), so for such codecs a GPU↔host unit may wait for a
	// disk unit's I/O.
	codecSerial bool
	lastCodec   *sharedEvent
	diskStreams []device.Stream
	// diskQ runs the disk streams' blob I/O (see diskQueue).
	diskQ    *diskQueue
	nextDisk int
	events   eventPool
	levels   []*storageLevel
	roots    map[blockhash.Key]*node
	nodes    nodeStore
	hasher   *blockhash.Hasher
	// windowed: some layer group slides (a decode step's Resize checks for
	// released blocks only then).
	windowed bool
	tick     uint64
	prune    []*node
	nextID   uint64
	caches   map[uint64]*KVCache
	stats    statCounters
	// losses counts lost pages ever; a cache rescans its pages for lost
	// ones only when it changed (see checkLost).
	losses uint64
	// lostBy is the failure that destroyed each lost page's data.
	lostBy map[*page]error
	pages  pageStore
	// spare is a closed cache's blocks, for the next cache.
	spare blockRows
	// Scratch of the hot paths, reused under the lock.
	adopted []*page
	pinned  []*page
	matched []*node
	missing []int
	dropped []releasedPage
	closed  bool
	// planned counts the PlannedDrops naming each tree page.
	planned map[plannedPage]int
	// rebalance samples request lengths for Adjust; now is its clock.
	rebalance rebalancer
	now       func() time.Time

	listeners []EventListener
	eventSeq  uint64

	diskFiles DiskOpener
	// shared is the shared tier, nil without one (see sharedlevel.go).
	shared *sharedLevel
	// blobFP is each lifecycle's layout fingerprint (see initBlobFormat);
	// diskSeq numbers the blob writes (the writer tags).
	blobFP  []blob.Fingerprint
	diskSeq uint64
	// codec is guarded: a panicking codec call is a failing one.
	codec      *codec.Guarded
	lcCodec    []lcCodec
	pageRing   *staging.Ring
	indexRing  *staging.IndexRing
	pending    []*inflight
	migrations [numPaths]MigrationCounter
	// Scratch reused by every migration.
	descs     []device.CopyDesc
	pairs     []codec.PageIndexPair
	pairBytes []byte // big-endian hosts only (codec.PairBytes)
}

// NewManager validates cfg, derives the layout and allocates every level, in
// the design's order: consume the codec (WithColdPageCodec, else the default),
// validate, allocate the hot level, configure the codec with the hot pool
// groups, query and validate every lifecycle's cold format, build the cold
// grouping, allocate the cold levels and staging. On failure everything is
// released, the supplied codec included.
func NewManager(cfg config.Config, opts ...Option) (_ *Manager, err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	taken, err := o.codec.Take()
	if err != nil {
		return nil, fmt.Errorf("cold_page_codec: %w", err)
	}
	if taken == nil {
		taken = codec.NewDefault()
	}
	cc := codec.Guard(taken)
	defer func() {
		if err != nil {
			codec.Destroy(cc)
		}
	}()
	if err := cfg.Validate(layout.NumLifeCycles(&cfg)); err != nil {
		return nil, err
	}
	// The shared tier is content-addressed (core/sharedtier), not a level of
	// slots: sharedlevel.go keeps it beside the local levels.
	sharedCfg, hasShared := cfg.Tier(config.SharedTier)
	cfg.CacheTiers = cfg.LocalTiers()
	if cfg.SwaScratchReuse != nil {
		r := *cfg.SwaScratchReuse // the manager's own copy
		cfg.SwaScratchReuse = &r
	}
	hasher, err := blockhash.NewHasherFor(cfg.BlockKey)
	if err != nil {
		return nil, err // Validate accepts only known algorithms
	}
	m := &Manager{
		cfg:    cfg,
		lt:     layout.New(&cfg),
		dev:    o.dev,
		roots:  map[blockhash.Key]*node{},
		hasher: hasher,
		caches: map[uint64]*KVCache{},
		lostBy: map[*page]error{},
		nodes:  newNodeStore(cfg.TokensPerBlock, layout.NumLifeCycles(&cfg)),

		codecSerial: !codec.IsMultiStream(taken),

		listeners: o.listeners,
		diskFiles: o.diskFiles,
		now:       time.Now,
	}
	m.windowed = slices.ContainsFunc(m.lt.LifeCycles, func(l layout.LifeCycle) bool { return l.Window.Size > 0 })
	if m.diskFiles == nil {
		m.diskFiles = OSDiskFiles
	}
	if m.dev == nil {
		dev, err := backend.Open("")
		if err != nil {
			return nil, fmt.Errorf("open the device: %w", err)
		}
		m.dev, m.ownDev = dev, true
	}
	m.events.dev = m.dev
	if err := m.init(cc); err != nil {
		m.release()
		return nil, err
	}
	if hasShared {
		if err := m.openShared(*sharedCfg.Shared); err != nil {
			m.release()
			return nil, err
		}
	}
	m.codec = cc
	return m, nil
}

func (m *Manager) init(cc *codec.Guarded) error {
	m.stats = newStatCounters(len(m.lt.LifeCycles), len(m.cfg.CacheTiers))
	weights := m.lt.ByteWeights(&m.cfg)
	m.rebalance = newRebalancer(&m.cfg, weights, len(m.cfg.CacheTiers), m.now())
	if err := m.initHotLevel(weights); err != nil {
		return err
	}
	// As many nodes as the GPU level has slots: blocks beyond that are
	// rare (they live on colder levels) and grow the store as needed.
	var hotSlots int64
	for _, g := range m.levels[0].groups {
		hotSlots += g.numSlots
	}
	m.nodes.reserve(int(hotSlots))
	m.pages.reserve(int(hotSlots))
	m.codec = cc
	defer func() { m.codec = nil }() // owned by NewManager until success
	if err := m.configureCodec(); err != nil {
		return err
	}
	if err := m.initBlobFormat(); err != nil {
		return err
	}
	if err := m.initColdLevels(weights); err != nil {
		return err
	}
	m.levels[len(m.levels)-1].last = true
	if err := m.initStaging(); err != nil {
		return err
	}
	if err := m.restoreDisk(); err != nil {
		return err
	}
	var err error
	if m.stream, err = m.dev.NewStream(); err != nil {
		return fmt.Errorf("create migration stream: %w", err)
	}
	if m.upStream, err = m.dev.NewStream(); err != nil {
		return fmt.Errorf("create onboarding stream: %w", err)
	}
	if _, ok := m.cfg.Tier(config.DiskTier); ok {
		for range numDiskStreams {
			st, err := m.dev.NewStream()
			if err != nil {
				return fmt.Errorf("create disk stream: %w", err)
			}
			m.diskStreams = append(m.diskStreams, st)
		}
		m.diskQ = newDiskQueue(diskQueueDepth)
	}
	return nil
}

func (m *Manager) initHotLevel(weights []float64) error {
	hot := m.cfg.CacheTiers[0]
	if ssm := m.lt.SSM; ssm >= 0 && m.cfg.MaxSsmSlots > 0 {
		if need := m.lt.ConstraintSlots(&m.cfg)[ssm]; need > m.cfg.MaxSsmSlots {
			return &config.Error{Field: "max_ssm_slots", Msg: fmt.Sprintf(
				"%d is below the %d SSM states the constraints need (one per request)", m.cfg.MaxSsmSlots, need)}
		}
	}
	// As in KVCacheManagerV2, the floors (a window's worth of slots per
	// layer group, the constraint batches with room for the resume gate)
	// are feasibility floors: a quota below them is raised to them, and
	// the level's quota is what its pools then take.
	floors := m.lt.HotFloors(&m.cfg)
	quota := m.lt.HotQuota(hot.Quota, floors)
	slots, err := m.lt.HotSlots(quota, weights, floors)
	if err != nil {
		return &config.Error{Field: "cache_tiers[0].quota", Msg: err.Error()}
	}
	capacity, err := m.lt.HotSlots(max(hot.MaxQuotaOrQuota(), quota), weights, floors)
	if err != nil {
		return &config.Error{Field: "cache_tiers[0].max_quota", Msg: err.Error()}
	}
	lvl := &storageLevel{index: 0, kind: hot.Kind, quota: quota, lcMap: m.lt.Levels[0].LifeCycleToGroup, nodes: &m.nodes}
	m.levels = append(m.levels, lvl)
	for gi, gl := range m.lt.Levels[0].Groups {
		g, err := newHotGroup(m.dev, lvl, gl, slots[gi], max(capacity[gi], slots[gi]))
		if err != nil {
			return err
		}
		lvl.groups = append(lvl.groups, g)
	}
	return nil
}

// Close closes every cache still open, in creation order, as KVCache.Close
// does (committed blocks stay published until the manager goes), waits for
// the manager's work and releases every level's memory, the staging rings
// and the codec. It always releases everything: an error (a cache whose
// stream could not be fenced, a failed synchronization) is reported after
// the release. Closing a closed manager does nothing; afterwards the
// manager's methods report ErrClosed and its caches are CLOSED.
func (m *Manager) Close() error {
	m.mu.Lock()
	err := m.closeLocked()
	m.mu.Unlock()
	// The shared tier's queued writes are flushed without the lock (each
	// batch bounded by its call timeout).
	if m.shared != nil {
		m.shared.close()
	}
	return err
}

func (m *Manager) closeLocked() error {
	if m.closed {
		return nil
	}
	var errs []error
	open := slices.Collect(maps.Values(m.caches))
	slices.SortFunc(open, func(a, b *KVCache) int { return cmp.Compare(a.id, b.id) })
	for _, c := range open {
		if err := c.closeLocked(true); err != nil {
			errs = append(errs, fmt.Errorf("close cache %d: %w", c.id, err))
		}
	}
	m.closed = true
	for _, st := range m.migrationStreams() {
		errs = append(errs, st.Synchronize())
	}
	if m.shared != nil {
		errs = append(errs, m.shared.stream.Synchronize())
	}
	m.release()
	return errors.Join(errs...)
}

// Shutdown closes the manager as Close does, but as KVCacheManagerV2's
// shutdown it refuses while caches are open: it returns ErrInvalidState,
// naming how many, and changes nothing. Shutting down a closed manager does
// nothing.
func (m *Manager) Shutdown() error {
	m.mu.Lock()
	if err := m.checkNoOpenCaches("shutdown"); err != nil {
		m.mu.Unlock()
		return err
	}
	m.mu.Unlock()
	return m.Close()
}

// ClearReusableBlocks drops every committed block from every level, so that
// nothing is reusable afterwards (each dropped block is reported as a cache
// event). As KVCacheManagerV2's it refuses while caches are open, since they
// hold blocks of the tree: it returns ErrInvalidState and changes nothing.
func (m *Manager) ClearReusableBlocks() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return err
	}
	if err := m.checkNoOpenCaches("clear reusable blocks"); err != nil {
		return err
	}
	m.settle()
	// Deepest first, in key order, so the events come out the same every
	// time.
	var clear func(n *node)
	clear = func(n *node) {
		for _, c := range m.sortedChildren(n) {
			clear(c)
		}
		for _, p := range m.pagesOf(n) {
			if p != nil {
				m.drop(p)
			}
		}
	}
	keys := slices.Sorted(maps.Keys(m.roots))
	for _, k := range keys {
		clear(m.roots[k])
	}
	m.safePoint()
	return nil
}

// NumOpenCaches returns how many caches are open (not closed).
func (m *Manager) NumOpenCaches() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.caches)
}

// checkNoOpenCaches fails with ErrInvalidState while caches are open.
func (m *Manager) checkNoOpenCaches(op string) error {
	if m.closed || len(m.caches) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s with %d KV caches still open; close them first", ErrInvalidState, op, len(m.caches))
}

func (m *Manager) release() {
	// Blob I/O still queued or running (a transaction that failed before its
	// stream waited for its jobs) reads and writes the staging ring, the host
	// slots and the disk files: it finishes before any of them is freed.
	if m.diskQ != nil {
		m.diskQ.close()
	}
	if m.pageRing != nil {
		m.pageRing.Close()
	}
	if m.indexRing != nil {
		m.indexRing.Close()
	}
	if m.codec != nil {
		codec.Destroy(m.codec)
		m.codec = nil
	}
	for _, l := range m.levels {
		for _, g := range l.groups {
			g.freeMemory()
		}
	}
	m.levels = nil
	for _, st := range m.migrationStreams() {
		st.Close()
	}
	if m.lastCodec != nil {
		m.events.release(m.lastCodec)
		m.lastCodec = nil
	}
	if m.shared != nil && m.shared.stream != nil {
		m.shared.stream.Close()
	}
	m.events.close()
	if m.ownDev {
		m.dev.Close()
	}
}

// Device returns the device the manager allocates from.
func (m *Manager) Device() device.Device { return m.dev }

// Layout returns the derived storage layout. It must not be modified.
func (m *Manager) Layout() *layout.Layout { return m.lt }

// TokensPerBlock returns the configured block size.
func (m *Manager) TokensPerBlock() int { return m.cfg.TokensPerBlock }

// ReuseMatchBackoff returns the configured Config.ReuseMatchBackoff.
func (m *Manager) ReuseMatchBackoff() int { return m.cfg.ReuseMatchBackoff }

// NumLayerGroups returns the number of layer groups (lifecycles).
func (m *Manager) NumLayerGroups() int { return len(m.lt.LifeCycles) }

// PoolGroupDescs describes the hot pool groups: index, reserved slots (the
// most the group can ever use; StorageStats reports how many it has now),
// member lifecycles and pools with base addresses. Base addresses never
// change, also when the GPU level is resized. It returns nil once the manager
// is closed.
func (m *Manager) PoolGroupDescs() []layout.PoolGroupDesc {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	return m.hotDescs()
}

func (m *Manager) hotDescs() []layout.PoolGroupDesc {
	var out []layout.PoolGroupDesc
	for _, g := range m.levels[0].groups {
		d := layout.PoolGroupDesc{Index: g.desc.Index, NumSlots: g.capacity, LifeCycles: g.desc.LifeCycles}
		for i, b := range g.desc.PoolBytes {
			d.Pools = append(d.Pools, layout.PoolDesc{Base: g.poolBase(i), SlotBytes: b})
		}
		out = append(out, d)
	}
	return out
}

// BufferLocation describes where the buffer of a layer and role lives in the
// hot layout: its pool base address, its stride (bytes per page index) and the
// scale and offset that turn a base page index into the buffer's page index.
type BufferLocation struct {
	layout.BufferLocation
	PoolBase device.Ptr
}

// PageIndex converts a base page index of the buffer's layer group into the
// buffer's kernel-facing page index.
func (b BufferLocation) PageIndex(base int32) int64 {
	if base < 0 {
		return -1
	}
	return int64(base)*b.Scale + b.Offset
}

// PageStride returns the bytes between consecutive kernel page indices of
// the buffer: its bytes per block over its expansion.
func (b BufferLocation) PageStride() int64 { return b.Bytes / int64(b.Expansion) }

// PageIndexMode selects what kernel page indices count from
// (KVCacheManagerV2's PageIndexMode).
type PageIndexMode int

const (
	// SharedIndex indices count from the buffer's own base address (its pool's
	// base plus its offset): buffers of a layer group with the same scale share
	// them.
	SharedIndex PageIndexMode = iota
	// PerLayerIndex indices count from the pool's base address and include the
	// buffer's offset.
	PerLayerIndex
)

// PageIndexConverter turns base page indices (KVCache.BasePageIndices) into
// a buffer's kernel page indices (KVCacheManagerV2's PageIndexConverter):
// base b becomes, for i in [0, Expansion), (b*Scale + offset)*Expansion + i,
// where offset is LayerOffset in PerLayerIndex mode and 0 in SharedIndex
// mode; BadPageIndex stays BadPageIndex, Expansion times.
type PageIndexConverter struct {
	Scale       int64
	Expansion   int
	LayerOffset int64
}

// Append appends the kernel page indices of base to dst.
func (p PageIndexConverter) Append(dst []int64, base []int32, mode PageIndexMode) []int64 {
	var off int64
	if mode == PerLayerIndex {
		off = p.LayerOffset
	}
	e := int64(p.Expansion)
	for _, b := range base {
		for i := range e {
			if b == BadPageIndex {
				dst = append(dst, int64(BadPageIndex))
			} else {
				dst = append(dst, (int64(b)*p.Scale+off)*e+i)
			}
		}
	}
	return dst
}

// PageIndexConverter returns the converter of a layer's buffer.
func (m *Manager) PageIndexConverter(layer int32, role config.DataRole) (PageIndexConverter, error) {
	loc, err := m.Buffer(layer, role)
	if err != nil {
		return PageIndexConverter{}, err
	}
	return PageIndexConverter{Scale: loc.Scale, Expansion: loc.Expansion, LayerOffset: loc.Offset}, nil
}

// PageIndexUpperBound returns one past the largest SharedIndex kernel page
// index of a layer's buffer: its pool viewed from the buffer's base address
// as an array of the buffer's pages (KVCacheManagerV2's
// get_page_index_upper_bound), so that the engine can wrap it as a tensor.
func (m *Manager) PageIndexUpperBound(layer int32, role config.DataRole) (int64, error) {
	loc, ok := m.lt.Buffers[layout.BufferKey{Layer: layer, Role: role}]
	if !ok {
		return 0, m.bufferErr(layer, role)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return 0, err
	}
	slots := m.levels[0].groupOf(loc.LifeCycle).capacity
	return (loc.Scale*slots - loc.Offset) * int64(loc.Expansion), nil
}

// Buffer returns the location of a layer's buffer.
func (m *Manager) Buffer(layer int32, role config.DataRole) (BufferLocation, error) {
	loc, ok := m.lt.Buffers[layout.BufferKey{Layer: layer, Role: role}]
	if !ok {
		return BufferLocation{}, m.bufferErr(layer, role)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return BufferLocation{}, err
	}
	g := m.levels[0].groupOf(loc.LifeCycle)
	return BufferLocation{BufferLocation: loc, PoolBase: g.poolBase(loc.Pool)}, nil
}

// AggregatedPageDesc is a run of buffers that lie side by side in every hot
// slot of one pool (KVCacheManagerV2's AggregatedPageDesc): for an
// aggregated page index i (KVCache.AggregatedPageIndices), the run's bytes
// are [Base + i*Stride, Base + i*Stride + Size).
type AggregatedPageDesc struct {
	Base       device.Ptr
	Size       int64
	Stride     int64
	LayerGroup layout.LayerGroupID
	Buffers    []layout.ExpandedBuffer
}

// AggregatedPages merges buffers into the fewest runs of contiguous bytes
// for bulk transfer, as layout.Layout.AggregatedPages describes, with their
// hot addresses. An unknown or repeated buffer is ErrInvalidArgument naming
// it.
func (m *Manager) AggregatedPages(buffers []layout.BufferKey) ([]AggregatedPageDesc, error) {
	runs, err := m.lt.AggregatedPages(buffers)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return nil, err
	}
	out := make([]AggregatedPageDesc, len(runs))
	for i, r := range runs {
		base := m.levels[0].groupOf(r.LayerGroup).poolBase(r.Pool)
		out[i] = AggregatedPageDesc{Base: base.Add(r.Offset), Size: r.Size, Stride: r.SlotBytes,
			LayerGroup: r.LayerGroup, Buffers: r.Buffers}
	}
	return out, nil
}

// LayerGroupOf returns the layer group (lifecycle) of a layer.
func (m *Manager) LayerGroupOf(layer int32) (layout.LayerGroupID, error) {
	for _, lc := range m.lt.LifeCycles {
		for _, l := range lc.Layers {
			if l == layer {
				return lc.ID, nil
			}
		}
	}
	return -1, argErr("layer_id", "unknown layer %d", layer)
}

// bufferErr is the error for a layer and role that name no buffer: it names
// layer_id when the manager has no such layer, else role.
func (m *Manager) bufferErr(layer int32, role config.DataRole) error {
	if _, err := m.LayerGroupOf(layer); err != nil {
		return err
	}
	return argErr("role", "no buffer %q in layer %d", role, layer)
}

// hotUtilization is the largest fraction, over hot pool groups, of slots
// that are neither free nor evictable, not counting the GPU pages of the
// cache about to resume (they are its own, already in place).
func (m *Manager) hotUtilization(resuming *KVCache) float64 {
	groups := m.levels[0].groups
	var few [8]int64 // per hot group, indexed by its position (its Index)
	own := few[:]
	if len(groups) > len(few) {
		own = make([]int64, len(groups))
	}
	resuming.eachPage(func(p *page) {
		if p.level() == 0 && !p.inVictims() {
			own[p.group.desc.Index]++
		}
	})
	var u float64
	for i, g := range groups {
		busy := g.used() - int64(g.victims.len()) - own[i]
		u = math.Max(u, float64(busy)/float64(g.numSlots))
	}
	return u
}

// safePoint prunes tree nodes that lost all pages and samples the slot-count
// peaks. It runs at the end of public operations, never while an operation
// may still be evicting.
func (m *Manager) safePoint() {
	if len(m.pending) > 0 {
		m.settle()
	}
	for len(m.prune) > 0 {
		n := m.prune[len(m.prune)-1]
		m.prune = m.prune[:len(m.prune)-1]
		if n.id == 0 {
			continue // pruned already (listed twice)
		}
		if n.parent == 0 {
			// A scope root goes once nothing hangs from it.
			if n.users == 0 && !n.hasChildren() && m.roots[n.key] == n {
				delete(m.roots, n.key)
				m.freeNode(n)
			}
			continue
		}
		parent := m.parentOf(n)
		if !m.prunable(n) || !m.isChild(parent, n) {
			continue
		}
		m.removeChild(parent, n)
		m.prune = append(m.prune, parent)
		m.freeNode(n)
	}
	m.notePeaks()
	m.pages.recycle()
}

func (m *Manager) notePeaks() {
	for _, l := range m.levels {
		for _, g := range l.groups {
			g.notePeaks()
		}
	}
}

func (m *Manager) root(scope blockhash.Scope) *node {
	k := scope.Root()
	r := m.roots[k]
	if r == nil {
		r = m.newNode(nil, k, nil, nil)
		m.roots[k] = r
	}
	return r
}

func (m *Manager) checkOpen() error {
	if m.closed {
		return ErrClosed
	}
	return nil
}
