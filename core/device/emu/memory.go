package emu

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/kvcm/kvcm/core/device"
)

// allocation is one anonymous mapping. base, buf and kind never change;
// committed changes under Device.memMu held for writing and is atomic so
// Size needs no lock; freed is guarded by Device.memMu. Only the first committed
// bytes of buf are addressable (less than len(buf) for a reservation).
type allocation struct {
	base      device.Ptr
	buf       []byte
	kind      device.MemoryKind
	committed atomic.Int64
	freed     bool
}

func (a *allocation) size() int64 { return a.committed.Load() }

// memory is the device.Memory handed to callers.
type memory struct {
	dev *Device
	a   *allocation
}

var _ device.Memory = (*memory)(nil)

// Alloc maps size bytes (size > 0) of the given kind. Both kinds come from
// anonymous mmap, so addresses are stable, outside the Go heap and usable from
// C. Exceeding the kind's limit fails with an error wrapping
// device.ErrOutOfMemory, as does a failed mmap.
func (d *Device) Alloc(kind device.MemoryKind, size int64) (device.Memory, error) {
	if kind != device.DeviceMemory && kind != device.HostMapped {
		return nil, fmt.Errorf("emu: alloc %d bytes: unknown memory kind %v", size, kind)
	}
	if size <= 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("emu: alloc %d bytes of %v memory: size must be positive and fit in an int", size, kind)
	}
	a, err := d.mapLocked(kind, size, size)
	if err != nil {
		return nil, fmt.Errorf("emu: alloc %d bytes of %v memory: %w", size, kind, err)
	}
	return &memory{dev: d, a: a}, nil
}

// Reserve maps capacity bytes of device memory (without reserving swap, so
// untouched pages cost nothing) and makes the first size of them
// addressable. The device memory limit counts committed bytes.
func (d *Device) Reserve(size, capacity int64) (device.Growable, error) {
	if size <= 0 || size > capacity || int64(int(capacity)) != capacity {
		return nil, fmt.Errorf("emu: reserve %d of %d bytes: need 0 < size <= capacity", size, capacity)
	}
	a, err := d.mapLocked(device.DeviceMemory, size, capacity)
	if err != nil {
		return nil, fmt.Errorf("emu: reserve %d of %d bytes: %w", size, capacity, err)
	}
	return &growable{memory{dev: d, a: a}}, nil
}

// mapLocked maps capacity bytes and registers the first size of them. It
// takes memMu itself.
func (d *Device) mapLocked(kind device.MemoryKind, size, capacity int64) (*allocation, error) {
	d.memMu.Lock()
	defer d.memMu.Unlock()
	// Checked under memMu so that Close, which unmaps under memMu after
	// setting closed, never misses an allocation made concurrently.
	if d.isClosed() {
		return nil, device.ErrClosed
	}
	if err := d.checkLimitLocked(kind, size); err != nil {
		return nil, err
	}
	flags := syscall.MAP_ANON | syscall.MAP_PRIVATE | syscall.MAP_NORESERVE
	if kind == device.HostMapped && d.opts.ResidentHostMemory {
		flags |= syscall.MAP_POPULATE
	}
	buf, err := syscall.Mmap(-1, 0, int(capacity), syscall.PROT_READ|syscall.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w: %w", err, device.ErrOutOfMemory)
	}
	// The slice of an mmap'd region never moves, so its address is a stable
	// Ptr. Going from pointer to uintptr (never back) keeps vet's unsafeptr
	// check clean.
	a := &allocation{base: device.Ptr(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), buf: buf, kind: kind}
	a.committed.Store(size)
	i, _ := slices.BinarySearchFunc(d.allocs, a.base, func(x *allocation, p device.Ptr) int { return cmpPtr(x.base, p) })
	d.allocs = slices.Insert(d.allocs, i, a)
	d.allocCount[kind].Add(1)
	d.liveAllocs[kind].Add(1)
	d.liveBytes[kind].Add(size)
	return a, nil
}

func (d *Device) checkLimitLocked(kind device.MemoryKind, more int64) error {
	limit := d.opts.DeviceMemoryLimit
	if kind == device.HostMapped {
		limit = d.opts.HostMemoryLimit
	}
	if live := d.liveBytes[kind].Load(); limit > 0 && more > limit-live {
		return fmt.Errorf("%d more bytes of %v memory with %d of %d bytes live: %w",
			more, kind, live, limit, device.ErrOutOfMemory)
	}
	return nil
}

// growable is a device.Growable over one reserved mapping.
type growable struct{ memory }

var _ device.Growable = (*growable)(nil)

func (g *growable) Capacity() int64 { return int64(len(g.a.buf)) }

// Resize moves the end of the addressable range. Released bytes are returned
// to the system (their contents are lost); copies that name them fail.
func (g *growable) Resize(size int64) error {
	d := g.dev
	d.memMu.Lock()
	defer d.memMu.Unlock()
	a := g.a
	switch {
	case a.freed && d.isClosed():
		return fmt.Errorf("emu: resize memory at %#x: %w", a.base, device.ErrClosed)
	case a.freed:
		return fmt.Errorf("emu: resize freed memory at %#x", a.base)
	case size <= 0 || size > int64(len(a.buf)):
		return fmt.Errorf("emu: resize memory at %#x to %d bytes: need 0 < size <= capacity %d", a.base, size, len(a.buf))
	case size > a.size():
		if err := d.checkLimitLocked(a.kind, size-a.size()); err != nil {
			return fmt.Errorf("emu: grow memory at %#x to %d bytes: %w", a.base, size, err)
		}
	case size < a.size():
		committed := a.size()
		clear(a.buf[size:committed]) // what a later grow exposes must not be stale data
		// Whole pages of the tail go back to the system.
		page := int64(syscall.Getpagesize())
		if from := (size + page - 1) / page * page; from < committed {
			if err := syscall.Madvise(a.buf[from:committed], syscall.MADV_DONTNEED); err != nil {
				return fmt.Errorf("emu: release %d bytes at %#x: %w", committed-from, a.base.Add(from), err)
			}
		}
	}
	d.liveBytes[a.kind].Add(size - a.size())
	a.committed.Store(size)
	return nil
}

func cmpPtr(a, b device.Ptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Ptr is the base address; for HostMapped memory it is the host address.
func (m *memory) Ptr() device.Ptr { return m.a.base }

// Size is the size requested from Alloc.
func (m *memory) Size() int64 { return m.a.size() }

// Kind is the kind requested from Alloc.
func (m *memory) Kind() device.MemoryKind { return m.a.kind }

// Host returns the bytes of HostMapped memory; nil for DeviceMemory and after
// the memory is freed. A slice obtained before Free must not be used after it:
// its pages are unmapped.
func (m *memory) Host() []byte {
	if m.a.kind != device.HostMapped {
		return nil
	}
	m.dev.memMu.RLock()
	defer m.dev.memMu.RUnlock()
	if m.a.freed {
		return nil
	}
	n := m.a.size()
	return m.a.buf[:n:n]
}

// Free unmaps the memory. It waits for a copy touching any memory that is
// running at that moment; copies queued later that name this memory fail
// asynchronously with device.ErrInvalidCopy. Freeing twice fails with
// ErrDoubleFree; after Device.Close (which frees everything) it fails with
// device.ErrClosed.
func (m *memory) Free() error {
	d := m.dev
	d.memMu.Lock()
	defer d.memMu.Unlock()
	if m.a.freed {
		if d.isClosed() {
			return fmt.Errorf("emu: free %v memory at %#x: %w", m.a.kind, m.a.base, device.ErrClosed)
		}
		return fmt.Errorf("emu: free %v memory at %#x: %w", m.a.kind, m.a.base, ErrDoubleFree)
	}
	i, found := slices.BinarySearchFunc(d.allocs, m.a.base, func(x *allocation, p device.Ptr) int { return cmpPtr(x.base, p) })
	if !found || d.allocs[i] != m.a {
		// Unreachable while the registry is consistent; say so rather than
		// unmapping memory that the registry does not own.
		return fmt.Errorf("emu: free %v memory at %#x: not in the allocation registry", m.a.kind, m.a.base)
	}
	d.allocs = slices.Delete(d.allocs, i, i+1)
	return d.unmapLocked(m.a)
}

// unmapLocked unmaps a, already removed from the registry. memMu is held for
// writing.
func (d *Device) unmapLocked(a *allocation) error {
	a.freed = true
	d.liveAllocs[a.kind].Add(-1)
	d.liveBytes[a.kind].Add(-a.size())
	if err := syscall.Munmap(a.buf); err != nil {
		return fmt.Errorf("emu: munmap %v memory at %#x: %w", a.kind, a.base, err)
	}
	return nil
}

// freeAll unmaps every live allocation; Close calls it once the stream
// workers have stopped.
func (d *Device) freeAll() error {
	d.memMu.Lock()
	defer d.memMu.Unlock()
	var errs []error
	for _, a := range d.allocs {
		errs = append(errs, d.unmapLocked(a))
	}
	d.allocs = nil
	return errors.Join(errs...)
}

// resolveLocked finds the live allocation holding [p, p+n) (n > 0) and the
// offset of p in it. memMu is held.
func (d *Device) resolveLocked(p device.Ptr, n int64) (*allocation, int64, error) {
	i, found := slices.BinarySearchFunc(d.allocs, p, func(x *allocation, p device.Ptr) int { return cmpPtr(x.base, p) })
	if !found {
		i-- // the allocation starting below p, if any
	}
	if i < 0 {
		return nil, 0, fmt.Errorf("[%#x, +%d) is below every live allocation", p, n)
	}
	a := d.allocs[i]
	// Compared unsigned: p far above every allocation (near the top of the
	// address space) is an offset beyond 2^63, which as an int64 would be
	// negative and pass for one inside the allocation.
	if uint64(p-a.base) >= uint64(a.size()) {
		return nil, 0, fmt.Errorf("[%#x, +%d) is not in a live allocation", p, n)
	}
	off := int64(p - a.base)
	if n > a.size()-off {
		return nil, 0, fmt.Errorf("[%#x, +%d) runs %d bytes past the end of the %v allocation [%#x, +%d)",
			p, n, n-(a.size()-off), a.kind, a.base, a.size())
	}
	return a, off, nil
}
