package codectest

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// GroupSpec is the shape of one hot pool group for a Rig.
type GroupSpec struct {
	NumSlots   int64
	LifeCycles []layout.LayerGroupID
	SlotBytes  []int64 // one entry per pool, in pool order
}

// Rig is a hot layout allocated on a device, with a stream and helpers to
// write and read device memory through host-mapped staging, for codec tests.
// It is not safe for concurrent use.
type Rig struct {
	Dev    device.Device
	Stream device.Stream
	Groups []layout.PoolGroupDesc
	mems   []device.Memory
}

// NewRig allocates every pool of specs as one allocation of kind (so a slot
// index out of range would reach memory outside the pool), and a stream.
func NewRig(dev device.Device, kind device.MemoryKind, specs ...GroupSpec) (*Rig, error) {
	r := &Rig{Dev: dev}
	s, err := dev.NewStream()
	if err != nil {
		return nil, err
	}
	r.Stream = s
	for i, sp := range specs {
		g := layout.PoolGroupDesc{
			Index:      layout.PoolGroupIndex(i),
			NumSlots:   sp.NumSlots,
			LifeCycles: append([]layout.LayerGroupID(nil), sp.LifeCycles...),
		}
		for _, sb := range sp.SlotBytes {
			m, err := r.Alloc(kind, sb*sp.NumSlots)
			if err != nil {
				return nil, errors.Join(err, r.Close())
			}
			g.Pools = append(g.Pools, layout.PoolDesc{Base: m.Ptr(), SlotBytes: sb})
		}
		r.Groups = append(r.Groups, g)
	}
	return r, nil
}

// Alloc allocates memory that Close frees.
func (r *Rig) Alloc(kind device.MemoryKind, size int64) (device.Memory, error) {
	m, err := r.Dev.Alloc(kind, size)
	if err != nil {
		return nil, err
	}
	r.mems = append(r.mems, m)
	return m, nil
}

// Group returns the pool group holding lifecycle lc.
func (r *Rig) Group(lc layout.LayerGroupID) *layout.PoolGroupDesc {
	for i := range r.Groups {
		for _, l := range r.Groups[i].LifeCycles {
			if l == lc {
				return &r.Groups[i]
			}
		}
	}
	return nil
}

// Slot returns the address of slot s in pool p of lc's group.
func (r *Rig) Slot(lc layout.LayerGroupID, p int, s int64) device.Ptr {
	g := r.Group(lc)
	return g.Pools[p].Base.Add(s * g.Pools[p].SlotBytes)
}

// Write copies b to device address p and waits for it.
func (r *Rig) Write(p device.Ptr, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	st, err := r.Dev.Alloc(device.HostMapped, int64(len(b)))
	if err != nil {
		return err
	}
	defer st.Free()
	copy(st.Host(), b)
	if err := r.Stream.BatchCopy([]device.CopyDesc{{Dst: p, Src: st.Ptr(), Size: int64(len(b))}}); err != nil {
		return err
	}
	return r.Stream.Synchronize()
}

// Read copies n bytes from device address p, after waiting for the stream.
func (r *Rig) Read(p device.Ptr, n int64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	st, err := r.Dev.Alloc(device.HostMapped, n)
	if err != nil {
		return nil, err
	}
	defer st.Free()
	if err := r.Stream.BatchCopy([]device.CopyDesc{{Dst: st.Ptr(), Src: p, Size: n}}); err != nil {
		return nil, err
	}
	if err := r.Stream.Synchronize(); err != nil {
		return nil, err
	}
	return append([]byte(nil), st.Host()[:n]...), nil
}

// WritePage writes page (the concatenation of the slot's bytes in every pool,
// in pool order) into slot s of lc's group.
func (r *Rig) WritePage(lc layout.LayerGroupID, s int64, page []byte) error {
	g := r.Group(lc)
	if int64(len(page)) != g.PageBytes() {
		return fmt.Errorf("codectest: page of %d bytes, group pages are %d", len(page), g.PageBytes())
	}
	off := int64(0)
	for p, pool := range g.Pools {
		if err := r.Write(r.Slot(lc, p, s), page[off:off+pool.SlotBytes]); err != nil {
			return err
		}
		off += pool.SlotBytes
	}
	return nil
}

// ReadPage reads slot s of lc's group as the concatenation of its pools.
func (r *Rig) ReadPage(lc layout.LayerGroupID, s int64) ([]byte, error) {
	g := r.Group(lc)
	var page []byte
	for p, pool := range g.Pools {
		b, err := r.Read(r.Slot(lc, p, s), pool.SlotBytes)
		if err != nil {
			return nil, err
		}
		page = append(page, b...)
	}
	return page, nil
}

// Close waits for and closes the stream and frees every allocation.
func (r *Rig) Close() error {
	var errs []error
	if r.Stream != nil {
		_ = r.Stream.Synchronize() // wait only: failures belong to the tests
		errs = append(errs, r.Stream.Close())
		r.Stream = nil
	}
	for _, m := range r.mems {
		errs = append(errs, m.Free())
	}
	r.mems = nil
	return errors.Join(errs...)
}
