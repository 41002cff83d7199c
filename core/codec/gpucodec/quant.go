//go:build cgo

package gpucodec

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/kernels"
)

// QuantOptions configure NewQuant.
type QuantOptions struct {
	// Format is the element type of every hot pool (Float16 or BFloat16).
	Format Format
	// BlockElems is the number of elements sharing one scale: a power of two
	// in [8, 256]; 0 means 128.
	BlockElems int
}

// DefaultBlockElems is QuantOptions.BlockElems' default.
const DefaultBlockElems = 128

// Quant is the fixed-ratio FP8 e4m3 codec (see the package doc). Every pool
// of a configured group must have a 16-byte aligned base and a SlotBytes that
// is a multiple of 2*BlockElems; Configure rejects other layouts.
//
// Cold page of a lifecycle whose hot group has pools 0..P-1: the e4m3 bytes
// of pool 0, pool 1, ... (one per element, SlotBytes_p/2 each), then the
// float32 scales of pool 0, pool 1, ... (one per block), padded to 16 bytes.
type Quant struct {
	*kernelCodec
	opts         QuantOptions
	log2Lanes    uint64
	enc, dec     *cuda.Function
	encBl, decBl int
}

var _ codec.ColdPageCodec = (*Quant)(nil)

// NewQuant loads the quantizing kernels on dev.
func NewQuant(dev *cuda.Device, opts QuantOptions) (*Quant, error) {
	if opts.BlockElems == 0 {
		opts.BlockElems = DefaultBlockElems
	}
	if opts.BlockElems < 8 || opts.BlockElems > 256 || bits.OnesCount(uint(opts.BlockElems)) != 1 {
		return nil, fmt.Errorf("gpucodec: quant: BlockElems %d is not a power of two in [8, 256]", opts.BlockElems)
	}
	if opts.Format != Float16 && opts.Format != BFloat16 {
		return nil, fmt.Errorf("gpucodec: quant: unknown format %d", int(opts.Format))
	}
	k, err := newKernelCodec(dev, "quant", kernels.Quant)
	if err != nil {
		return nil, err
	}
	q := &Quant{kernelCodec: k, opts: opts, log2Lanes: uint64(bits.TrailingZeros(uint(opts.BlockElems / 8)))}
	var e1, e2 error
	q.enc, q.encBl, e1 = k.function("kvcm_quant_encode")
	q.dec, q.decBl, e2 = k.function("kvcm_quant_decode")
	if err := errors.Join(e1, e2); err != nil {
		return nil, errors.Join(err, k.Close())
	}
	k.build = q.build
	return q, nil
}

// Options are the codec's options, defaults filled in.
func (q *Quant) Options() QuantOptions { return q.opts }

// build lays out one group: per pool {base, slotBytes, dataOff, scaleOff,
// firstBlock}.
func (q *Quant) build(d layout.PoolGroupDesc) ([]uint64, group, bool) {
	blockBytes := int64(2 * q.opts.BlockElems)
	page := d.PageBytes()
	var table []uint64
	var data, blocks int64
	for _, p := range d.Pools {
		if p.Base%16 != 0 || p.SlotBytes%blockBytes != 0 {
			return nil, group{}, false
		}
		blocks += p.SlotBytes / blockBytes
	}
	scales := page / 2
	var first int64
	for _, p := range d.Pools {
		nb := p.SlotBytes / blockBytes
		table = append(table, uint64(p.Base), uint64(p.SlotBytes), uint64(data), uint64(scales), uint64(first))
		data += p.SlotBytes / 2
		scales += 4 * nb
		first += nb
	}
	stride := (page/2 + 4*blocks + 15) / 16 * 16
	return table, group{unitsPerPage: blocks, coldStride: stride}, true
}

func (q *Quant) perWarp() int64 { return 32 / int64(q.opts.BlockElems/8) }

func (q *Quant) extra() []uint64 {
	return []uint64{uint64(q.opts.Format), q.log2Lanes}
}

// Encode enqueues on stream the quantization of hot slots idx[i].Src into
// cold pages dstBase + idx[i].Dst*QueryColdPageBytes(lg) (Device indices;
// dstBase 16-byte aligned).
func (q *Quant) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return q.launch(lg, codec.ToCold, dstBase, idx, stream, func(_ *group, cold device.Ptr) (*cuda.Function, int) {
		if cold%16 != 0 {
			return nil, 0
		}
		return q.enc, q.encBl
	}, q.perWarp(), q.extra()...)
}

// Decode enqueues on stream the dequantization of cold pages srcBase +
// idx[i].Src*QueryColdPageBytes(lg) into hot slots idx[i].Dst.
func (q *Quant) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return q.launch(lg, codec.ToHot, srcBase, idx, stream, func(_ *group, cold device.Ptr) (*cuda.Function, int) {
		if cold%16 != 0 {
			return nil, 0
		}
		return q.dec, q.decBl
	}, q.perWarp(), q.extra()...)
}

// Identity names the quantized format with its element type and block size.
func (q *Quant) Identity() string {
	return fmt.Sprintf("kvcm.quant-e4m3/1 %v block=%d", q.opts.Format, q.opts.BlockElems)
}
