//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/device"
)

// vmm is the state of growable device memory: a reserved address range and
// the physical chunks mapped at its start.
type vmm struct {
	reserved int64 // bytes of address space (capacity rounded to granularity)
	capacity int64 // as requested
	chunks   []chunk
}

type chunk struct {
	off, size int64
	handle    C.uint64_t
}

func (v *vmm) committed() int64 {
	if len(v.chunks) == 0 {
		return 0
	}
	c := v.chunks[len(v.chunks)-1]
	return c.off + c.size
}

// growable is a device.Growable over CUDA virtual memory management.
type growable struct{ *allocation }

var _ device.Growable = growable{}

// granularity is the recommended VMM granularity of the device (cached).
func (d *Device) granularity() (int64, error) {
	d.granOnce.Do(func() {
		var vmmOK C.int
		if err := check("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)",
			C.kv_device_attr(d.cuDev, C.KV_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, &vmmOK)); err != nil {
			d.granErr = err
			return
		}
		if vmmOK == 0 {
			d.granErr = fmt.Errorf("cuda: %s does not support virtual memory management, which growable memory needs", d.props.Name)
			return
		}
		var g C.size_t
		d.granErr = check("cuMemGetAllocationGranularity", C.kv_vmm_granularity(d.ctx, C.int(d.opts.Ordinal), &g))
		d.gran = int64(g)
	})
	return d.gran, d.granErr
}

func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }

// Reserve reserves capacity bytes of device address space (cuMemAddressReserve)
// and commits the first size bytes (cuMemCreate + cuMemMap + cuMemSetAccess,
// in chunks of the recommended granularity). Committed bytes read as zero.
func (d *Device) Reserve(size, capacity int64) (device.Growable, error) {
	if size <= 0 || size > capacity {
		return nil, fmt.Errorf("cuda: reserve %d of %d bytes: need 0 < size <= capacity", size, capacity)
	}
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda: reserve %d of %d bytes: %w", size, capacity, device.ErrClosed)
	}
	gran, err := d.granularity()
	if err != nil {
		return nil, err
	}
	a := &allocation{dev: d, kind: device.DeviceMemory, vmm: &vmm{reserved: roundUp(capacity, gran), capacity: capacity}}
	var p C.kv_CUdeviceptr
	if err := checkf(C.kv_vmm_reserve(d.ctx, &p, C.size_t(a.vmm.reserved), C.size_t(gran)),
		"cuMemAddressReserve(%d bytes)", a.vmm.reserved); err != nil {
		return nil, err
	}
	a.base = device.Ptr(p)
	if err := d.resizeVMM(a, size); err != nil {
		return nil, errors.Join(err, d.releaseVMM(a))
	}
	d.register(a)
	return growable{a}, nil
}

// Capacity is the reserved size, the most Resize may grow to.
func (g growable) Capacity() int64 { return g.vmm.capacity }

// Resize commits or releases memory at the end so that Size becomes size, in
// (0, Capacity]. Growing maps new chunks and zeroes the bytes it exposes;
// shrinking unmaps and releases the chunks wholly beyond size. The caller
// makes sure no enqueued work still uses a released tail.
func (g growable) Resize(size int64) error {
	d := g.dev
	d.memMu.Lock()
	defer d.memMu.Unlock()
	if g.freed.Load() {
		return fmt.Errorf("cuda: resize freed memory at %#x", g.base)
	}
	if size <= 0 || size > g.vmm.capacity {
		return fmt.Errorf("cuda: resize memory at %#x to %d bytes: need 0 < size <= capacity %d", g.base, size, g.vmm.capacity)
	}
	return d.resizeVMM(g.allocation, size)
}

// resizeVMM moves the committed end of a to cover size bytes; memMu is held
// for writing (or a is not yet registered).
func (d *Device) resizeVMM(a *allocation, size int64) error {
	gran, err := d.granularity()
	if err != nil {
		return err
	}
	v := a.vmm
	want := roundUp(size, gran)
	if c := v.committed(); want > c {
		var h C.uint64_t
		if err := checkf(C.kv_vmm_map(d.ctx, C.int(d.opts.Ordinal), C.kv_CUdeviceptr(a.base.Add(c)), C.size_t(want-c), &h),
			"cuMemCreate/cuMemMap/cuMemSetAccess(%d bytes at %#x)", want-c, a.base.Add(c)); err != nil {
			return err
		}
		v.chunks = append(v.chunks, chunk{off: c, size: want - c, handle: h})
	}
	for len(v.chunks) > 0 {
		c := v.chunks[len(v.chunks)-1]
		if c.off < size {
			break
		}
		if err := checkf(C.kv_vmm_unmap(d.ctx, C.kv_CUdeviceptr(a.base.Add(c.off)), C.size_t(c.size), c.handle),
			"cuMemUnmap/cuMemRelease(%d bytes at %#x)", c.size, a.base.Add(c.off)); err != nil {
			return err
		}
		v.chunks = v.chunks[:len(v.chunks)-1]
	}
	if size > a.size {
		if err := d.zero(a.base.Add(a.size), size-a.size); err != nil {
			return err
		}
	}
	a.size = size
	a.curSize.Store(size)
	return nil
}

// releaseVMM unmaps every chunk of a and frees its address range.
func (d *Device) releaseVMM(a *allocation) error {
	var errs []error
	v := a.vmm
	for i := len(v.chunks) - 1; i >= 0; i-- {
		c := v.chunks[i]
		errs = append(errs, checkf(C.kv_vmm_unmap(d.ctx, C.kv_CUdeviceptr(a.base.Add(c.off)), C.size_t(c.size), c.handle),
			"cuMemUnmap/cuMemRelease(%d bytes at %#x)", c.size, a.base.Add(c.off)))
	}
	v.chunks = nil
	if a.base != 0 {
		errs = append(errs, checkf(C.kv_vmm_free(d.ctx, C.kv_CUdeviceptr(a.base), C.size_t(v.reserved)),
			"cuMemAddressFree(%#x, %d bytes)", a.base, v.reserved))
	}
	return errors.Join(errs...)
}

// zero sets n device bytes at p to zero and waits for it, on the device's
// private stream.
func (d *Device) zero(p device.Ptr, n int64) error {
	d.privMu.Lock()
	defer d.privMu.Unlock()
	if d.priv == nil {
		var s C.kv_CUstream
		if err := check("cuStreamCreate (private)", C.kv_stream_create(d.ctx, &s)); err != nil {
			return err
		}
		d.priv = s
	}
	if err := checkf(C.kv_memset8(d.ctx, d.priv, C.kv_CUdeviceptr(p), 0, C.size_t(n)), "cuMemsetD8Async(%#x, %d bytes)", p, n); err != nil {
		return err
	}
	return check("cuStreamSynchronize (private)", C.kv_stream_sync(d.ctx, d.priv))
}
