//go:build cgo

package gpucodec

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/kernels"
)

// GatherKernels lists the 16-byte gather kernel variants GatherOptions.Kernel
// selects, with the bytes one warp moves per step (its tile):
//
//	gather16     4 KiB tiles, streaming loads (ld.global.cs)
//	gather16_pf  4 KiB tiles, streaming loads with the L2::256B prefetch hint
//	gather16_nc  4 KiB tiles, read-only loads with the L2::256B hint
//	gather16_8k  8 KiB tiles, streaming loads with the L2::256B hint
var GatherKernels = map[string]int64{
	"gather16": 4096, "gather16_pf": 4096, "gather16_nc": 4096, "gather16_8k": 8192,
}

// DefaultGatherKernel is the variant NewGather uses.
const DefaultGatherKernel = "gather16"

// GatherOptions configure NewGatherWith.
type GatherOptions struct {
	// Kernel is a key of GatherKernels; "" means DefaultGatherKernel.
	Kernel string
}

// Gather is the lossless device-index gather/scatter codec (see the package
// doc). Its cold pages are byte-identical to the default codec's.
type Gather struct {
	*kernelCodec
	tile              int64
	fn16, fn1         *cuda.Function
	blocks16, blocks1 int
}

var _ codec.ColdPageCodec = (*Gather)(nil)

// NewGather loads the gather kernels on dev, with the default variant.
func NewGather(dev *cuda.Device) (*Gather, error) { return NewGatherWith(dev, GatherOptions{}) }

// NewGatherWith loads the gather kernels on dev with opts.
func NewGatherWith(dev *cuda.Device, opts GatherOptions) (*Gather, error) {
	if opts.Kernel == "" {
		opts.Kernel = DefaultGatherKernel
	}
	tile, ok := GatherKernels[opts.Kernel]
	if !ok {
		return nil, fmt.Errorf("gpucodec: gather: unknown kernel variant %q", opts.Kernel)
	}
	k, err := newKernelCodec(dev, "gather", kernels.Gather)
	if err != nil {
		return nil, err
	}
	g := &Gather{kernelCodec: k, tile: tile}
	var e1, e2 error
	g.fn16, g.blocks16, e1 = k.function("kvcm_" + opts.Kernel)
	g.fn1, g.blocks1, e2 = k.function("kvcm_gather1")
	if err := errors.Join(e1, e2); err != nil {
		return nil, errors.Join(err, k.Close())
	}
	k.build = g.build
	return g, nil
}

// build lays out one group: per pool {base, slotBytes, coldOff, firstTile};
// the cold page is the concatenation of the pools' slots.
func (g *Gather) build(d layout.PoolGroupDesc) ([]uint64, group, bool) {
	var table []uint64
	var off, tiles int64
	vec16 := true
	for _, p := range d.Pools {
		table = append(table, uint64(p.Base), uint64(p.SlotBytes), uint64(off), uint64(tiles))
		vec16 = vec16 && p.Base%16 == 0 && p.SlotBytes%16 == 0
		off += p.SlotBytes
		tiles += (p.SlotBytes + g.tile - 1) / g.tile
	}
	return table, group{unitsPerPage: tiles, coldStride: off, vec16: vec16}, true
}

// Encode enqueues on stream the gather of hot slots idx[i].Src into cold
// pages dstBase + idx[i].Dst*QueryColdPageBytes(lg). idx must be Device
// indices; the call returns false, enqueuing nothing, on anything the host can
// check.
func (g *Gather) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return g.launch(lg, codec.ToCold, dstBase, idx, stream, g.pick, 1, 0, uint64(g.tile))
}

// Decode enqueues on stream the scatter of cold pages srcBase +
// idx[i].Src*QueryColdPageBytes(lg) into hot slots idx[i].Dst.
func (g *Gather) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return g.launch(lg, codec.ToHot, srcBase, idx, stream, g.pick, 1, 1, uint64(g.tile))
}

func (g *Gather) pick(gr *group, coldBase device.Ptr) (*cuda.Function, int) {
	if gr.vec16 && coldBase%16 == 0 {
		return g.fn16, g.blocks16
	}
	return g.fn1, g.blocks1
}

// Identity is the default codec's: Gather writes the same bytes.
func (g *Gather) Identity() string { return codec.ConcatIdentity }
