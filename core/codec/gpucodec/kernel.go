//go:build cgo

package gpucodec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/kernels"
)

// maxPools is KVCM_MAX_POOLS / KVCM_Q_MAX_POOLS of the kernels.
const maxPools = 128

const threadsPerBlock = 256

// group is one configured hot pool group as the kernels see it.
type group struct {
	table        device.Memory // the kernel's pool table, device memory
	numPools     int
	numSlots     int64
	unitsPerPage int64 // tiles (gather) or blocks (quant) per page
	coldStride   int64 // QueryColdPageBytes
	vec16        bool  // gather: every pool is 16-byte aligned
}

// kernelCodec is what Gather and Quant share: configuration, validation,
// launching and the asynchronous index check.
type kernelCodec struct {
	dev  *cuda.Device
	name string
	mod  *cuda.Module
	errs *errSlots

	// build turns a validated hot group into its kernel table (one entry per
	// pool, little-endian uint64 fields) and its geometry; false rejects the
	// configuration.
	build func(g layout.PoolGroupDesc) (table []uint64, gr group, ok bool)

	mu         sync.Mutex
	hot        *codec.HotLayout
	groups     map[layout.PoolGroupIndex]*group
	configured bool
	closed     bool
}

func newKernelCodec(dev *cuda.Device, name, ptxName string) (*kernelCodec, error) {
	if dev == nil {
		return nil, fmt.Errorf("gpucodec: %s: nil device", name)
	}
	ptx, err := kernels.PTX(ptxName)
	if err != nil {
		return nil, err
	}
	mod, err := dev.LoadModule(ptx)
	if err != nil {
		return nil, fmt.Errorf("gpucodec: %s: loading kernels/%s.ptx: %w", name, ptxName, err)
	}
	errs, err := newErrSlots(dev)
	if err != nil {
		return nil, errors.Join(err, mod.Close())
	}
	return &kernelCodec{dev: dev, name: name, mod: mod, errs: errs}, nil
}

func (k *kernelCodec) function(name string) (*cuda.Function, int, error) {
	f, err := k.mod.Function(name)
	if err != nil {
		return nil, 0, err
	}
	regs, err := f.NumRegs()
	if err != nil {
		return nil, 0, err
	}
	p := k.dev.Properties()
	perSM := p.MaxThreadsPerMultiprocessor / threadsPerBlock
	if regs > 0 {
		perSM = min(perSM, 65536/(regs*threadsPerBlock))
	}
	return f, max(1, perSM) * p.Multiprocessors, nil
}

// Configure validates the layout, builds every group's table and uploads the
// tables to device memory. It is called once; false rejects the whole
// configuration.
func (k *kernelCodec) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || k.configured {
		return false
	}
	k.configured = true
	hl, err := codec.NewHotLayout(gpuDescs)
	if err != nil {
		return false
	}
	groups := make(map[layout.PoolGroupIndex]*group)
	ok := false
	defer func() {
		if !ok {
			for _, g := range groups {
				_ = g.table.Free()
			}
		}
	}()
	s, err := k.dev.NewStream()
	if err != nil {
		return false
	}
	defer s.Close()
	for _, d := range hl.Groups() {
		if len(d.Pools) > maxPools {
			return false
		}
		table, gr, good := k.build(d)
		if !good {
			return false
		}
		buf := make([]byte, 8*len(table))
		for i, v := range table {
			binary.LittleEndian.PutUint64(buf[8*i:], v)
		}
		mem, err := k.dev.Alloc(device.DeviceMemory, int64(len(buf)))
		if err != nil {
			return false
		}
		gr.table, gr.numPools, gr.numSlots = mem, len(d.Pools), d.NumSlots
		groups[d.Index] = &gr
		if s.CopyFromHost(mem.Ptr(), buf) != nil {
			return false
		}
	}
	if s.Synchronize() != nil {
		return false
	}
	k.hot, k.groups, ok = hl, groups, true
	return true
}

// groupOf is lg's configured group; mu is held.
func (k *kernelCodec) groupOf(lg layout.LayerGroupID) *group {
	d := k.hot.GroupOf(lg)
	if d == nil || k.closed {
		return nil
	}
	return k.groups[d.Index]
}

func (k *kernelCodec) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	if g := k.groupOf(lg); g != nil {
		return g.coldStride
	}
	return 0
}

func (k *kernelCodec) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.groupOf(lg) == nil {
		return -1
	}
	return lg
}

func (k *kernelCodec) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.groupOf(lg) == nil {
		return codec.BadLocation
	}
	return codec.Device
}

// launch is one Encode or Decode: validate, launch fn over every unit of the
// call's pages, then enqueue the index check. perWarp is how many units one
// warp handles per step. args are the kernel parameters after the common
// ones (idx, nPairs, coldBase, coldStride, table, numPools, unitsPerPage,
// numSlots) and before the error word.
func (k *kernelCodec) launch(lg layout.LayerGroupID, dir codec.Direction, coldBase device.Ptr, idx codec.PageIndices,
	stream device.Stream, pick func(g *group, coldBase device.Ptr) (*cuda.Function, int), perWarp int64, args ...uint64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	g := k.groupOf(lg)
	if g == nil || idx.Location() != codec.Device {
		return false
	}
	n := int64(idx.Len())
	if n == 0 {
		return true
	}
	s, ok := cuda.AsStream(stream)
	if !ok || s.Device() != k.dev {
		return false
	}
	ip := idx.DevicePtr()
	if ip == 0 || ip%codec.PageIndexPairBytes != 0 || coldBase == 0 {
		return false
	}
	fn, maxBlocks := pick(g, coldBase)
	if fn == nil {
		return false
	}
	slot, errPtr, ok := k.errs.get()
	if !ok {
		return false
	}
	warps := (n*g.unitsPerPage + perWarp - 1) / perWarp
	blocks := min((warps*32+threadsPerBlock-1)/threadsPerBlock, int64(maxBlocks))
	params := append([]uint64{uint64(ip), uint64(n), uint64(coldBase), uint64(g.coldStride), uint64(g.table.Ptr()),
		uint64(g.numPools), uint64(g.unitsPerPage), uint64(g.numSlots)}, args...)
	params = append(params, uint64(errPtr))
	if s.Launch(fn, cuda.Dim3{X: uint32(blocks), Y: 1, Z: 1}, cuda.Dim3{X: threadsPerBlock, Y: 1, Z: 1}, 0, params...) != nil {
		k.errs.put(slot)
		return false
	}
	// The check reads the word in stream order after the kernel; HostCheck
	// batches it with the checks of the calls that follow, so a migration of
	// many calls pays one host round trip.
	errs, name := k.errs, k.name
	if s.HostCheck(func() error { return errs.check(slot, name, lg, dir) }) != nil {
		// The kernel is enqueued and may still write the word: never reuse it.
		return true
	}
	return true
}

// MultiStream is true: a call's work uses only its own error slot and the
// read-only pool tables, so calls on different streams may run at once.
func (k *kernelCodec) MultiStream() bool { return true }

// Close frees the codec's device memory and unloads its kernels; the owner
// must have waited for all work the codec enqueued. It is idempotent.
func (k *kernelCodec) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	var errs []error
	for _, g := range k.groups {
		errs = append(errs, g.table.Free())
	}
	k.groups, k.hot = nil, nil
	errs = append(errs, k.errs.close(), k.mod.Close())
	return errors.Join(errs...)
}

// errSlots are host-mapped words a kernel sets when it meets a bad index;
// each in-flight call owns one until its check host function gives it back.
type errSlots struct {
	mem device.Memory

	mu   sync.Mutex
	free []int
}

const numErrSlots = 1024

func newErrSlots(dev *cuda.Device) (*errSlots, error) {
	mem, err := dev.Alloc(device.HostMapped, 4*numErrSlots)
	if err != nil {
		return nil, err
	}
	clear(mem.Host())
	e := &errSlots{mem: mem, free: make([]int, numErrSlots)}
	for i := range e.free {
		e.free[i] = numErrSlots - 1 - i
	}
	return e, nil
}

func (e *errSlots) word(i int) *uint32 { return (*uint32)(unsafe.Pointer(&e.mem.Host()[4*i])) }

func (e *errSlots) get() (int, device.Ptr, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.free) == 0 {
		return 0, 0, false
	}
	i := e.free[len(e.free)-1]
	e.free = e.free[:len(e.free)-1]
	return i, e.mem.Ptr().Add(4 * int64(i)), true
}

func (e *errSlots) put(i int) {
	e.mu.Lock()
	e.free = append(e.free, i)
	e.mu.Unlock()
}

// check runs in stream order after the kernel: it reads and clears the word
// and gives the slot back.
func (e *errSlots) check(i int, name string, lg layout.LayerGroupID, dir codec.Direction) error {
	w := e.word(i)
	bad := atomic.SwapUint32(w, 0)
	e.put(i)
	if bad != 0 {
		return fmt.Errorf("gpucodec: %s %v of lifecycle %d: a page index pair names a hot slot outside its pool group or a negative cold page: %w",
			name, dir, lg, codec.ErrBadIndex)
	}
	return nil
}

func (e *errSlots) close() error { return e.mem.Free() }
