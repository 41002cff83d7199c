//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/kvcm/kvcm/core/device"
)

// allocation is one cuMemAlloc block, one registered host mapping or one
// growable reservation. size is guarded by Device.memMu (it changes only for
// growable memory); curSize and freed are atomic copies for Size, Host and
// Free, which never take memMu: host functions may call Host and Size, and a
// host function must never wait for a lock held across a driver call that
// may itself wait for that host function.
type allocation struct {
	dev     *Device
	base    device.Ptr
	size    int64
	kind    device.MemoryKind
	mapping []byte // HostMapped: the whole page-rounded mapping; never changes
	regions int    // HostMapped: registered regions
	vmm     *vmm   // growable device memory (Reserve); nil otherwise
	split   bool   // HostMapped and larger than one registration region

	curSize atomic.Int64
	freed   atomic.Bool
}

var _ device.Memory = (*allocation)(nil)

// Alloc allocates size bytes (size > 0). DeviceMemory comes from cuMemAlloc;
// HostMapped memory from an anonymous mapping registered with
// cuMemHostRegister(PORTABLE|DEVICEMAP) in regions of Options.HostRegionBytes,
// each checked to have its host address as its device address. A failure of
// the driver for lack of memory wraps device.ErrOutOfMemory.
func (d *Device) Alloc(kind device.MemoryKind, size int64) (device.Memory, error) {
	if kind != device.DeviceMemory && kind != device.HostMapped {
		return nil, fmt.Errorf("cuda: alloc %d bytes: unknown memory kind %v", size, kind)
	}
	if size <= 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("cuda: alloc %d bytes of %v memory: size must be positive", size, kind)
	}
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda: alloc %d bytes of %v memory: %w", size, kind, device.ErrClosed)
	}
	a := &allocation{dev: d, size: size, kind: kind}
	var err error
	if kind == device.DeviceMemory {
		var p C.kv_CUdeviceptr
		err = checkf(C.kv_mem_alloc(d.ctx, &p, C.size_t(size)), "cuMemAlloc(%d bytes)", size)
		a.base = device.Ptr(p)
	} else {
		err = d.mapHost(a)
	}
	if err != nil {
		return nil, err
	}
	a.curSize.Store(size)
	a.split = kind == device.HostMapped && size > d.region
	d.register(a)
	return a, nil
}

func (d *Device) register(a *allocation) {
	d.memMu.Lock()
	i, _ := slices.BinarySearchFunc(d.allocs, a.base, cmpBase)
	d.allocs = slices.Insert(d.allocs, i, a)
	d.memMu.Unlock()
}

func cmpBase(a *allocation, p device.Ptr) int {
	switch {
	case a.base < p:
		return -1
	case a.base > p:
		return 1
	}
	return 0
}

// mapHost maps and registers a host allocation.
func (d *Device) mapHost(a *allocation) error {
	page := int64(os.Getpagesize())
	n := (a.size + page - 1) / page * page
	buf, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("cuda: alloc %d bytes of host-mapped memory: mmap: %w: %w", a.size, err, device.ErrOutOfMemory)
	}
	a.mapping = buf
	a.base = device.Ptr(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	for off := int64(0); off < n; off += d.region {
		ln := min(d.region, n-off)
		p := unsafe.Pointer(&buf[off])
		var dev C.kv_CUdeviceptr
		if err := checkf(C.kv_host_register(d.ctx, p, C.size_t(ln), &dev),
			"cuMemHostRegister(%d bytes at %#x, PORTABLE|DEVICEMAP)", ln, uintptr(p)); err != nil {
			return errors.Join(err, d.unmapHost(a))
		}
		a.regions++
		if uintptr(dev) != uintptr(p) {
			return errors.Join(fmt.Errorf("cuda: host memory registered at %#x maps to device address %#x: kvcm needs them equal (unified addressing)",
				uintptr(p), uintptr(dev)), d.unmapHost(a))
		}
	}
	return nil
}

// unmapHost unregisters the registered regions of a and unmaps it.
func (d *Device) unmapHost(a *allocation) error {
	var errs []error
	for r := 0; r < a.regions; r++ {
		p := unsafe.Pointer(&a.mapping[int64(r)*d.region])
		errs = append(errs, checkf(C.kv_host_unregister(d.ctx, p), "cuMemHostUnregister(%#x)", uintptr(p)))
	}
	a.regions = 0
	if err := syscall.Munmap(a.mapping); err != nil {
		errs = append(errs, fmt.Errorf("cuda: munmap host memory at %#x: %w", a.base, err))
	}
	return errors.Join(errs...)
}

// Ptr is the base address; for HostMapped memory it is also the host address.
func (a *allocation) Ptr() device.Ptr { return a.base }

// Size is the size requested from Alloc (the current size of growable
// memory).
func (a *allocation) Size() int64 { return a.curSize.Load() }

// Kind is the kind requested from Alloc.
func (a *allocation) Kind() device.MemoryKind { return a.kind }

// Host returns the bytes of HostMapped memory; nil for DeviceMemory and after
// Free. A slice obtained before Free must not be used after it.
func (a *allocation) Host() []byte {
	if a.kind != device.HostMapped || a.freed.Load() {
		return nil
	}
	return a.mapping[:a.size:a.size]
}

// Free releases the memory; no enqueued work may still use it. Freeing twice
// fails with ErrDoubleFree, after Device.Close (which frees everything) with
// device.ErrClosed.
func (a *allocation) Free() error {
	d := a.dev
	d.memMu.Lock()
	if a.freed.Load() {
		d.memMu.Unlock()
		if d.closed.Load() {
			return fmt.Errorf("cuda: free %v memory at %#x: %w", a.kind, a.base, device.ErrClosed)
		}
		return fmt.Errorf("cuda: free %v memory at %#x: %w", a.kind, a.base, ErrDoubleFree)
	}
	i, found := slices.BinarySearchFunc(d.allocs, a.base, cmpBase)
	if !found || d.allocs[i] != a {
		d.memMu.Unlock()
		return fmt.Errorf("cuda: free %v memory at %#x: not in the allocation registry", a.kind, a.base)
	}
	d.allocs = slices.Delete(d.allocs, i, i+1)
	a.freed.Store(true)
	d.memMu.Unlock()
	// Released outside memMu: the driver may wait for work in flight.
	return d.release(a)
}

// release returns a's resources to the driver and the OS; a is already out
// of the registry.
func (d *Device) release(a *allocation) error {
	if a.vmm != nil {
		return d.releaseVMM(a)
	}
	if a.kind == device.DeviceMemory {
		return checkf(C.kv_mem_free(d.ctx, C.kv_CUdeviceptr(a.base)), "cuMemFree(%#x)", a.base)
	}
	return d.unmapHost(a)
}

// freeAll releases every live allocation (Close).
func (d *Device) freeAll() error {
	d.memMu.Lock()
	all := d.allocs
	d.allocs = nil
	for _, a := range all {
		a.freed.Store(true)
	}
	d.memMu.Unlock()
	var errs []error
	for _, a := range all {
		errs = append(errs, d.release(a))
	}
	return errors.Join(errs...)
}

// memo remembers the allocations one side of a batch resolved last, so a
// batch touching a handful of pools costs a comparison or two per
// descriptor: the last hit is tried first, then the one after it (pools
// rotate), then the others.
type memo struct {
	a    [8]*allocation
	last int
	next int
}

func (a *allocation) holds(p device.Ptr, n int64) bool {
	return p >= a.base && n <= a.size && uint64(p-a.base) <= uint64(a.size-n)
}

// resolveLocked finds the live allocation holding [p, p+n) (n > 0). memMu is
// held for reading.
func (d *Device) resolveLocked(p device.Ptr, n int64, m *memo) (*allocation, error) {
	if a := m.a[m.last]; a != nil && a.holds(p, n) {
		return a, nil
	}
	// Batches often rotate through pools in the order they were first seen.
	if i := (m.last + 1) % len(m.a); m.a[i] != nil && m.a[i].holds(p, n) {
		m.last = i
		return m.a[i], nil
	}
	if m.a[0] != nil && m.a[0].holds(p, n) {
		m.last = 0
		return m.a[0], nil
	}
	for i := range m.a {
		a := m.a[i]
		if a == nil {
			break
		}
		if a.holds(p, n) {
			m.last = i
			return a, nil
		}
	}
	i, found := slices.BinarySearchFunc(d.allocs, p, cmpBase)
	if !found {
		i--
	}
	if i < 0 {
		return nil, fmt.Errorf("[%#x, +%d) is below every live allocation", p, n)
	}
	a := d.allocs[i]
	off := int64(p - a.base)
	if off >= a.size {
		return nil, fmt.Errorf("[%#x, +%d) is not in a live allocation", p, n)
	}
	if n > a.size-off {
		return nil, fmt.Errorf("[%#x, +%d) runs %d bytes past the end of the %v allocation [%#x, +%d)",
			p, n, n-(a.size-off), a.kind, a.base, a.size)
	}
	m.a[m.next], m.last = a, m.next
	m.next = (m.next + 1) % len(m.a)
	return a, nil
}

// toRegionEnd is how many bytes from offset off of a stay inside one
// registration region (the rest of the allocation for device memory).
func (d *Device) toRegionEnd(a *allocation, off int64) int64 {
	if !a.split {
		return a.size - off
	}
	return d.region - off%d.region
}
