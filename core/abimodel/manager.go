package abimodel

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/core/layout"
)

// Options are the parts of a C manager configuration that are not
// config.Config.
type Options struct {
	// Device names the backend: "" (or backend.Auto) defers to
	// backend.Open("") (KVCM_DEVICE, else CUDA where there is a GPU, else the
	// emulation); backend.Emu or backend.CUDA select one.
	Device string
	// DeviceOrdinal selects the CUDA device; it must not be negative.
	DeviceOrdinal int
	// EventQueueCapacity bounds the event queue; 0 means
	// DefaultEventQueueCapacity.
	EventQueueCapacity int
	// Codec is consumed by New, also when New fails; nil selects the default
	// codec.
	Codec *codec.Owned
	// Builtin, when set (and Codec is nil), selects a built-in codec that New
	// makes on the device it opens (gpucodec.New): the gather and FP8 codecs
	// exist only on CUDA, so on the emulated device New fails with
	// core.ErrCodecRejected wrapping gpucodec.ErrNeedsCUDA.
	Builtin *gpucodec.Spec
	// Registry receives the manager's device; nil means Devices.
	Registry *DeviceRegistry
}

// Validate checks cfg and opts without allocating anything.
func Validate(cfg config.Config, opts Options) error {
	if _, err := deviceName(opts); err != nil {
		return err
	}
	if opts.EventQueueCapacity < 0 {
		return argErr("config.event_queue_capacity", "must not be negative, got %d", opts.EventQueueCapacity)
	}
	return cfg.Validate(layout.NumLifeCycles(&cfg))
}

func deviceName(opts Options) (string, error) {
	switch opts.Device {
	case "", backend.Auto, backend.Emu, backend.CUDA:
	default:
		return "", argErr("config.device", "unknown device %q", opts.Device)
	}
	if opts.DeviceOrdinal < 0 {
		return "", argErr("config.device_ordinal", "must not be negative, got %d", opts.DeviceOrdinal)
	}
	if opts.Device == backend.Auto {
		return "", nil
	}
	return opts.Device, nil
}

// Manager is a kvcm_manager: a core.Manager with the device it opened, the
// streams and memory allocated on it, the event queue, and the CP index new
// caches notify. All methods are safe for concurrent use.
type Manager struct {
	m        *core.Manager
	dev      device.Device
	registry *DeviceRegistry
	events   *EventQueue
	closed   atomic.Bool // set first by Close: CP indexes answer as Null

	mu       sync.Mutex // guards caches, mem, gone, attached and claiming caches
	caches   map[*Cache]struct{}
	closing  sync.WaitGroup // Cache.Close calls in flight (Add under mu)
	mem      map[device.Ptr]device.Memory
	gone     bool
	attached *CPIndex

	smu      sync.Mutex // guards streams, retiring and resuming
	streams  map[uintptr]device.Stream
	retiring map[uintptr]bool // streams DestroyStream is synchronizing
	resuming map[uintptr]int  // Cache.Resume calls in flight, per stream

	lmu       sync.Mutex // guards listeners, nextL, emitted
	listeners map[int]core.EventListener
	nextL     int
	emitted   bool
}

// New opens the device opts select and creates the manager on it. The codec
// is consumed on every path: handed to core.NewManager, or destroyed.
func New(cfg config.Config, opts Options) (*Manager, error) {
	name, err := deviceName(opts)
	if err != nil {
		opts.Codec.Discard()
		return nil, err
	}
	if opts.EventQueueCapacity < 0 {
		opts.Codec.Discard()
		return nil, argErr("config.event_queue_capacity", "must not be negative, got %d", opts.EventQueueCapacity)
	}
	capacity := opts.EventQueueCapacity
	if capacity == 0 {
		capacity = DefaultEventQueueCapacity
	}
	reg := opts.Registry
	if reg == nil {
		reg = Devices
	}
	dev, err := backend.OpenWith(name, backend.Options{CUDA: cuda.Options{Ordinal: opts.DeviceOrdinal}})
	if err != nil {
		opts.Codec.Discard()
		return nil, err
	}
	if opts.Builtin != nil && opts.Codec == nil {
		c, err := gpucodec.New(dev, *opts.Builtin)
		if err != nil {
			dev.Close()
			return nil, fmt.Errorf("%w: %w", core.ErrCodecRejected, err)
		}
		opts.Codec = codec.Own(c)
	}
	mgr := &Manager{
		dev: dev, registry: reg, events: NewEventQueue(capacity),
		caches: map[*Cache]struct{}{}, mem: map[device.Ptr]device.Memory{},
		streams: map[uintptr]device.Stream{}, retiring: map[uintptr]bool{}, resuming: map[uintptr]int{},
	}
	// NewManager takes the codec as its first act and destroys it on failure.
	m, err := core.NewManager(cfg, core.WithDevice(dev), core.WithColdPageCodec(opts.Codec), core.WithEventListener(mgr.onEvent))
	if err != nil {
		dev.Close()
		return nil, err
	}
	mgr.m = m
	reg.Register(dev)
	return mgr, nil
}

// Core returns the core manager, for queries. After Close its methods
// report core.ErrClosed.
func (mgr *Manager) Core() *core.Manager { return mgr.m }

// DeviceName returns the backend the manager runs on: backend.Emu or
// backend.CUDA.
func (mgr *Manager) DeviceName() string {
	if mgr.dev.Name() == backend.Emu {
		return backend.Emu
	}
	return backend.CUDA
}

// Events returns the manager's event queue.
func (mgr *Manager) Events() *EventQueue { return mgr.events }

// onEvent is the core manager's event listener (called with its lock held):
// the listeners added later (manager-backed CP indexes), then the queue.
func (mgr *Manager) onEvent(e core.CacheEvent) {
	mgr.lmu.Lock()
	mgr.emitted = true
	for _, l := range mgr.listeners {
		l(e)
	}
	mgr.lmu.Unlock()
	mgr.events.Push(e)
}

// Listen adds a listener that sees every event of the manager: it fails
// with core.ErrInvalidState once the manager has emitted an event. The
// returned func removes it.
func (mgr *Manager) Listen(l core.EventListener) (remove func(), err error) {
	mgr.lmu.Lock()
	defer mgr.lmu.Unlock()
	if mgr.closed.Load() {
		return nil, destroyedErr("manager is being destroyed")
	}
	if mgr.emitted {
		return nil, fmt.Errorf("%w: the manager has already stored blocks: add the listener (create the manager-backed index) before the first commit", core.ErrInvalidState)
	}
	if mgr.listeners == nil {
		mgr.listeners = map[int]core.EventListener{}
	}
	id := mgr.nextL
	mgr.nextL++
	mgr.listeners[id] = l
	return func() {
		mgr.lmu.Lock()
		delete(mgr.listeners, id)
		mgr.lmu.Unlock()
	}, nil
}

// AllocMemory allocates memory on the manager's device; the manager frees it
// at Close unless FreeMemory did.
func (mgr *Manager) AllocMemory(kind device.MemoryKind, size uint64) (device.Ptr, error) {
	mgr.mu.Lock()
	defer mgr.mu.Unlock()
	if mgr.gone {
		return 0, destroyedErr("manager is being destroyed")
	}
	mem, err := allocMemory(mgr.dev, kind, size)
	if err != nil {
		return 0, err
	}
	mgr.mem[mem.Ptr()] = mem
	return mem.Ptr(), nil
}

// FreeMemory frees memory AllocMemory returned.
func (mgr *Manager) FreeMemory(ptr device.Ptr) error {
	mgr.mu.Lock()
	mem, ok := mgr.mem[ptr]
	delete(mgr.mem, ptr)
	mgr.mu.Unlock()
	if !ok {
		return argErr("ptr", "%#x was not allocated by this manager or was already freed", uint64(ptr))
	}
	return mem.Free()
}

// AttachCP makes x the index that caches created from now on (with a request
// id) notify; the manager holds a reference to it until DetachCP, another
// AttachCP or Close. It fails with ErrDestroyed when x was destroyed.
func (mgr *Manager) AttachCP(x *CPIndex) error {
	mgr.mu.Lock()
	defer mgr.mu.Unlock()
	if mgr.gone {
		return destroyedErr("manager is being destroyed")
	}
	if !x.tryAcquire() {
		return destroyedErr("cp: the index was destroyed")
	}
	old := mgr.attached
	mgr.attached = x
	if old != nil {
		old.release()
	}
	return nil
}

// DetachCP drops the attached index, if any; caches that notify it keep it
// alive until they close.
func (mgr *Manager) DetachCP() {
	mgr.mu.Lock()
	old := mgr.attached
	mgr.attached = nil
	mgr.mu.Unlock()
	if old != nil {
		old.release()
	}
}

// Close destroys the manager: it closes every open cache (in creation
// order; a cache notifying a CP index notifies its terminal free), waits
// for Cache.Close calls in flight, lets go of the attached CP index,
// synchronizes and destroys the streams it created, closes the core manager
// (every level's memory and the codec), frees the memory it allocated and
// closes the device. It always releases everything and reports the errors
// it met on the way. Closing a closed manager does nothing.
func (mgr *Manager) Close() error {
	if !mgr.closed.CompareAndSwap(false, true) {
		return nil
	}
	mgr.mu.Lock()
	mgr.gone = true
	attached := mgr.attached
	mgr.attached = nil
	var caches []*Cache
	for c := range mgr.caches {
		c.claimed = true
		caches = append(caches, c)
	}
	clear(mgr.caches)
	mems := slices.Collect(maps.Values(mgr.mem))
	clear(mgr.mem)
	mgr.mu.Unlock()
	var errs []error
	slices.SortFunc(caches, func(a, b *Cache) int { return cmp.Compare(a.c.ID(), b.c.ID()) })
	for _, c := range caches {
		if err := c.close(); err != nil {
			errs = append(errs, fmt.Errorf("close cache %d: %w", c.c.ID(), err))
		}
	}
	mgr.closing.Wait()
	if attached != nil {
		attached.release()
	}
	mgr.smu.Lock()
	streams := slices.Collect(maps.Values(mgr.streams))
	clear(mgr.streams)
	mgr.smu.Unlock()
	// Work the engine (or a codec) queued on the manager's streams runs
	// before the codec is destroyed and the device closed.
	for _, s := range streams {
		s.Synchronize()
	}
	if err := mgr.m.Close(); err != nil {
		errs = append(errs, err)
	}
	for _, s := range streams {
		s.Close()
	}
	for _, mem := range mems {
		mem.Free()
	}
	mgr.registry.Unregister(mgr.dev)
	mgr.dev.Close()
	return errors.Join(errs...)
}

// open reports core.ErrClosed once the core manager is closed.
// Open fails with core.ErrClosed once the manager is closed.
func (mgr *Manager) Open() error { return mgr.open() }

func (mgr *Manager) open() error {
	_, err := mgr.m.Quota(layout.GPULevel)
	return err
}

// PoolGroupDescs describes the pool groups of a level: the hot descriptors
// (with base addresses) for the GPU level; for a cold level one pool per
// group, the encoded page size, without a base address (cold pages are not
// device-addressable).
func (mgr *Manager) PoolGroupDescs(level layout.CacheLevel) ([]layout.PoolGroupDesc, error) {
	if level == layout.GPULevel {
		if err := mgr.open(); err != nil {
			return nil, err
		}
		return mgr.m.PoolGroupDescs(), nil
	}
	stats, err := mgr.m.StorageStats(level)
	if err != nil {
		return nil, err
	}
	out := make([]layout.PoolGroupDesc, len(stats))
	for i, s := range stats {
		out[i] = layout.PoolGroupDesc{Index: s.Index, NumSlots: s.Total, LifeCycles: s.LifeCycles,
			Pools: []layout.PoolDesc{{SlotBytes: s.PageBytes}}}
	}
	return out, nil
}

// ProbeReuse returns how many of the tokens a new cache would reuse (see
// core.Manager.ProbeReuse); it fails with core.ErrClosed once closed.
func (mgr *Manager) ProbeReuse(scope blockhash.Scope, tokens []config.Token) (int, error) {
	if err := mgr.open(); err != nil {
		return 0, err
	}
	return mgr.m.ProbeReuse(scope, tokens), nil
}

// PathMigrationStats is a kvcm_migration_stats: the pages and bytes moved on
// one path.
type PathMigrationStats struct {
	Path core.Path
	core.MigrationCounter
}

// MigrationStats returns the pages and bytes moved on every path, one entry
// per path in core.Paths order (see core.Manager.MigrationStats); it fails
// with core.ErrClosed once closed.
func (mgr *Manager) MigrationStats() ([]PathMigrationStats, error) {
	if err := mgr.open(); err != nil {
		return nil, err
	}
	ms := mgr.m.MigrationStats()
	out := make([]PathMigrationStats, 0, len(core.Paths()))
	for _, p := range core.Paths() {
		out = append(out, PathMigrationStats{Path: p, MigrationCounter: ms[p]})
	}
	return out, nil
}

// ProbeFirstNewBlockKey returns the key of the first full block of tokens
// past the prefix a new cache would reuse, and whether there is one (see
// core.Manager.ProbeFirstNewBlockKeyDigests). It fails with core.ErrClosed
// once closed.
func (mgr *Manager) ProbeFirstNewBlockKey(scope blockhash.Scope, tokens []config.Token) (blockhash.Key, bool, error) {
	return mgr.ProbeFirstNewBlockKeyDigests(scope, tokens, nil, "")
}

// ProbeFirstNewBlockKeyDigests is ProbeFirstNewBlockKey for tokens with
// digest tokens, given by their positions and bytes (see Digests).
func (mgr *Manager) ProbeFirstNewBlockKeyDigests(scope blockhash.Scope, tokens []config.Token, positions []uint64, digestBytes string) (blockhash.Key, bool, error) {
	ds, err := Digests(positions, digestBytes, "digest_positions")
	if err != nil {
		return 0, false, err
	}
	if err := mgr.open(); err != nil {
		return 0, false, err
	}
	return mgr.m.ProbeFirstNewBlockKeyDigests(scope, tokens, ds)
}

// ProbeReuseDigests is ProbeReuse for tokens with digest tokens, given by
// their positions and bytes (see Digests).
func (mgr *Manager) ProbeReuseDigests(scope blockhash.Scope, tokens []config.Token, positions []uint64, digestBytes string) (int, error) {
	ds, err := Digests(positions, digestBytes, "digest_positions")
	if err != nil {
		return 0, err
	}
	if err := mgr.open(); err != nil {
		return 0, err
	}
	return mgr.m.ProbeReuseDigests(scope, tokens, ds)
}

// ExpandedBuffer is a kvcm_expanded_buffer: a buffer of an aggregated page,
// named by its position in the buffers asked for.
type ExpandedBuffer struct {
	Buffer    int
	Expansion int
}

// AggregatedPage is a kvcm_aggregated_page_desc: core.AggregatedPageDesc
// with its buffers named by their positions in the buffers asked for.
type AggregatedPage struct {
	Base       device.Ptr
	Size       int64
	Stride     int64
	LayerGroup layout.LayerGroupID
	Buffers    []ExpandedBuffer
}

// AggregatedPages merges buffers into runs of contiguous bytes (see
// core.Manager.AggregatedPages), each run's buffers named by their
// positions in buffers.
func (mgr *Manager) AggregatedPages(buffers []layout.BufferKey) ([]AggregatedPage, error) {
	ds, err := mgr.m.AggregatedPages(buffers)
	if err != nil {
		return nil, err
	}
	pos := make(map[layout.BufferKey]int, len(buffers))
	for i, b := range buffers {
		if _, dup := pos[b]; !dup {
			pos[b] = i
		}
	}
	out := make([]AggregatedPage, len(ds))
	for i, d := range ds {
		out[i] = AggregatedPage{Base: d.Base, Size: d.Size, Stride: d.Stride, LayerGroup: d.LayerGroup, Buffers: make([]ExpandedBuffer, len(d.Buffers))}
		for j, b := range d.Buffers {
			out[i].Buffers[j] = ExpandedBuffer{Buffer: pos[b.Buffer], Expansion: b.Expansion}
		}
	}
	return out, nil
}

// GetAndResetIterationPeakBlockStats returns a level's peak usage per pool
// group since the last reset, and resets it, when room (the caller's buffer)
// holds every group; otherwise it returns nil and resets nothing. needed is
// the number of groups either way.
func (mgr *Manager) GetAndResetIterationPeakBlockStats(level layout.CacheLevel, room int) (peaks []core.PeakBlockStats, needed int, err error) {
	st, err := mgr.m.StorageStats(level) // the group count of a level never changes
	if err != nil {
		return nil, 0, err
	}
	if room < len(st) || len(st) == 0 {
		return nil, len(st), nil
	}
	peaks, err = mgr.m.GetAndResetIterationPeakBlockStats(level)
	return peaks, len(peaks), err
}
