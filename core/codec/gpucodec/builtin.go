package gpucodec

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
)

// Kind names one of the built-in codecs New makes.
type Kind int

const (
	// KindDefault is the default codec (codec.NewDefault).
	KindDefault Kind = iota
	// KindGather is Gather, with the default kernel variant.
	KindGather
	// KindFP8 is Quant: FP8 e4m3 with one scale per block.
	KindFP8
	// KindAuto is Auto, DMA or Gather per lifecycle.
	KindAuto
)

func (k Kind) String() string {
	switch k {
	case KindDefault:
		return "default"
	case KindGather:
		return "gather"
	case KindFP8:
		return "fp8"
	case KindAuto:
		return "auto"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Spec selects a built-in codec and its options: what a caller that has no
// device yet (a C caller before kvcm_manager_create opens one) can say.
type Spec struct {
	Kind Kind
	// Format is KindFP8's hot element type (QuantOptions.Format).
	Format Format
	// BlockElems is KindFP8's elements per scale (QuantOptions.BlockElems;
	// 0 means DefaultBlockElems).
	BlockElems int
	// CrossoverBytes is KindAuto's crossover (AutoOptions.CrossoverBytes;
	// 0 means AutoCrossoverBytes).
	CrossoverBytes int64
}

// ErrNeedsCUDA is wrapped by New's error when the codec has CUDA kernels
// only (Gather, FP8: they have no emulation) and the device is not a CUDA
// device, or the build has no cgo.
var ErrNeedsCUDA = errors.New("the codec's kernels run on a CUDA device only")

// SpecError is Spec.Validate's error: the field (as the C ABI spells it)
// and why it is refused.
type SpecError struct {
	Field, Reason string
}

func (e *SpecError) Error() string { return "gpucodec: " + e.Field + ": " + e.Reason }

// Validate checks s's options without a device; the error is a *SpecError.
func (s Spec) Validate() error {
	switch s.Kind {
	case KindDefault, KindGather, KindFP8, KindAuto:
	default:
		return &SpecError{"kind", fmt.Sprintf("unknown built-in codec %d", int(s.Kind))}
	}
	if s.Format != Float16 && s.Format != BFloat16 {
		return &SpecError{"element", fmt.Sprintf("unknown element type %d", int(s.Format))}
	}
	if s.BlockElems != 0 && (s.BlockElems < 8 || s.BlockElems > 256 || bits.OnesCount(uint(s.BlockElems)) != 1) {
		return &SpecError{"block_elems", fmt.Sprintf("%d is not 0 or a power of two in [8, 256]", s.BlockElems)}
	}
	if s.CrossoverBytes < 0 {
		return &SpecError{"crossover_bytes", fmt.Sprintf("must not be negative, got %d", s.CrossoverBytes)}
	}
	return nil
}

// newKernelSpec makes a Gather or Quant for s on dev; nil, nil where dev is
// not a CUDA device. Set by the cgo build.
var newKernelSpec func(dev device.Device, s Spec) (codec.ColdPageCodec, error)

// New makes the codec s selects on dev. The default codec and Auto work on
// every device (Auto is the default codec where there is no kernel); Gather
// and FP8 fail with an error wrapping ErrNeedsCUDA on any other device, such
// as the emulated one, and in a build without cgo.
func New(dev device.Device, s Spec) (codec.ColdPageCodec, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	switch s.Kind {
	case KindDefault:
		return codec.NewDefault(), nil
	case KindAuto:
		return NewAutoWith(dev, AutoOptions{CrossoverBytes: s.CrossoverBytes})
	}
	if dev == nil {
		return nil, fmt.Errorf("gpucodec: %v: nil device", s.Kind)
	}
	if newKernelSpec != nil {
		c, err := newKernelSpec(dev, s)
		if err != nil || c != nil {
			return c, err
		}
	}
	return nil, fmt.Errorf("gpucodec: the %v codec on the %s device: %w", s.Kind, dev.Name(), ErrNeedsCUDA)
}
