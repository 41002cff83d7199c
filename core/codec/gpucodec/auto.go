package gpucodec

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/staged"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// AutoCrossoverBytes is the chunk size at and above which Auto moves a
// lifecycle's pages with DMA (the default codec) rather than the gather
// kernel. The chunk is one descriptor of the default codec: a page's slot in
// one pool, averaged over the pools of the lifecycle's hot group.
//
// Where it comes from (docs/benchmarks.md, `kvcm bench migrate` on an H200,
// PCIe gen5): a DMA descriptor costs the copy engine a fixed o ≈ 0.36–0.43 µs
// on top of size/B with B ≈ 55.4 GB/s the contiguous limit (from the
// measured 42.6 / 42.3 GB/s at 64 KiB and 54.2 / 54.1 GB/s at 1 MiB), so DMA
// reaches the fraction 1/(1 + o·B/size) of the limit; the gather kernel
// holds 0.91–0.94 of it at every size. The two meet at size = o·B·r/(1-r):
// about 260 KiB for encode and 210 KiB for decode. Measured at 256 KiB
// itself, the two are level within the run-to-run spread (DMA 0.913 / 0.898
// against gather 0.914 / 0.848 in one run, 0.896 / 0.900 against 0.932 /
// 0.933 in the next); at 64 KiB DMA is at 0.58–0.77 (the kernel wins by a
// fifth or more), at 1 MiB at 0.95–0.98 (DMA wins by 2–6%). At the tie DMA
// is taken: it leaves the SMs to the engine's own kernels. The kernel's
// submit cost (a few ns a page against ~0.5 µs of host time per descriptor)
// points the same way below the crossover.
const AutoCrossoverBytes = 256 << 10

// StagedCrossoverBytes is the crossover when lifecycles below it take the
// staged codec: staging keeps 0.96–0.98 of a direction's limit at 256 KiB,
// where DMA reaches 0.84–0.88 (0.94–0.97 against 0.77 with both directions
// at once), and the two are level at 1 MiB (0.98–0.99 either way; duplex
// 0.95 staged, 0.96 DMA), where DMA is taken as at the kernel's tie
// (docs/benchmarks.md, session 3 and 4 duplex tables on the H200).
const StagedCrossoverBytes = 1 << 20

// Staging says whether Auto's lifecycles below the crossover take the staged
// codec (device staging, then DMA of contiguous chunks) rather than the
// gather kernel over mapped host memory.
type Staging int

const (
	// StageWithKernel stages over the gather kernel where the device has
	// it, and takes DMA elsewhere (the default): on CUDA eviction and
	// onboarding then run at once near the two-stream DMA limit, at the cost
	// of a device ring of staged.DefaultChunkBytes × DefaultRingChunks
	// (128 MiB) per stream that migrates, made on first use.
	StageWithKernel Staging = iota
	// StageNever keeps the gather kernel below the crossover: no device
	// staging memory, but a kernel over mapped host memory does not overlap
	// the other direction (EVALUATION.md §1b).
	StageNever
	// StageAlways stages on every device, over the default codec's device
	// copies where there is no kernel (the emulated device: it exercises
	// staging, at two memmoves a page).
	StageAlways
)

// Choice is how Auto moves one lifecycle's pages.
type Choice int

const (
	// DMA is the default codec: host indices, one copy descriptor per page
	// and pool, one batch copy per call.
	DMA Choice = iota
	// Kernel is the Gather codec: device indices, one kernel per call.
	Kernel
	// Staged is the staged codec (core/codec/staged): pages gathered into
	// device staging (by the gather kernel, or by the default codec's device
	// copies where there is no kernel), then DMA of contiguous chunks; the
	// copy engines of both directions work at once.
	Staged
)

func (c Choice) String() string {
	switch c {
	case DMA:
		return "dma"
	case Kernel:
		return "gather"
	case Staged:
		return "staged"
	}
	return fmt.Sprintf("Choice(%d)", int(c))
}

// Choose is Auto's rule: the gather kernel when kernel codecs are available
// and the group's mean slot bytes per pool is below crossover, DMA otherwise
// (also for a group without pools).
func Choose(g layout.PoolGroupDesc, crossover int64, kernelAvailable bool) Choice {
	if !kernelAvailable || len(g.Pools) == 0 {
		return DMA
	}
	if g.PageBytes() < crossover*int64(len(g.Pools)) {
		return Kernel
	}
	return DMA
}

// AutoOptions configure NewAutoWith.
type AutoOptions struct {
	// CrossoverBytes replaces AutoCrossoverBytes when positive.
	CrossoverBytes int64
	// GatherKernel is the gather kernel variant (GatherOptions.Kernel); ""
	// is the default one.
	GatherKernel string
	// Staging says when lifecycles below the crossover take Staged; the
	// default stages where the device has the gather kernel.
	Staging Staging
	// Stage configures the staged codec when it is used.
	Stage staged.Options
}

// Auto is a lossless codec that picks, per lifecycle at Configure, DMA (the
// default codec) or, below the crossover, the staged codec over the gather
// kernel (AutoOptions.Staging; StagedCrossoverBytes) or the kernel alone
// (StageNever; AutoCrossoverBytes), from the lifecycle's chunk size (see
// Choose). All write the default codec's
// cold format, so QueryColdPageBytes and batching are the default codec's;
// QueryPageIndexLocation is Device for kernel lifecycles and Host for the
// others. On a device other than a CUDA one (the emulation), or in a build
// without cgo, there is no kernel: every lifecycle takes DMA and Auto behaves
// exactly as the default codec. If the gather codec rejects the layout, every
// lifecycle takes DMA as well.
type Auto struct {
	dma       codec.ColdPageCodec
	kernel    codec.ColdPageCodec // nil: no kernel codecs on this device, or staged owns it
	staged    *staged.Codec       // nil when no lifecycle can stage
	hasKernel bool
	crossover int64

	mu         sync.Mutex
	configured bool
	choice     map[layout.LayerGroupID]Choice
}

var _ codec.ColdPageCodec = (*Auto)(nil)

// newKernelFor returns the gather codec for dev, or nil where dev has no
// kernel codecs. Set by the cgo build.
var newKernelFor func(dev device.Device, variant string) (codec.ColdPageCodec, error)

// NewAuto returns an Auto for dev with the default crossover.
func NewAuto(dev device.Device) (*Auto, error) { return NewAutoWith(dev, AutoOptions{}) }

// NewAutoWith returns an Auto for dev. On a CUDA device it loads the gather
// kernels now (an error if that fails).
func NewAutoWith(dev device.Device, opts AutoOptions) (*Auto, error) {
	switch opts.Staging {
	case StageWithKernel, StageNever, StageAlways:
	default:
		return nil, fmt.Errorf("gpucodec: auto: unknown Staging %d", int(opts.Staging))
	}
	a := &Auto{dma: codec.NewDefault()}
	if newKernelFor != nil && dev != nil {
		k, err := newKernelFor(dev, opts.GatherKernel)
		if err != nil {
			return nil, fmt.Errorf("gpucodec: auto: %w", err)
		}
		a.kernel, a.hasKernel = k, k != nil
	}
	stage := opts.Staging == StageAlways || opts.Staging == StageWithKernel && a.hasKernel
	switch {
	case opts.CrossoverBytes > 0:
		a.crossover = opts.CrossoverBytes
	case stage:
		a.crossover = StagedCrossoverBytes
	default:
		a.crossover = AutoCrossoverBytes
	}
	if stage {
		inner := a.kernel
		if inner == nil {
			inner = codec.NewDefault()
		}
		st, err := staged.New(dev, inner, opts.Stage)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("gpucodec: auto: %w", err), codec.Destroy(inner))
		}
		a.staged, a.kernel = st, nil
	}
	return a, nil
}

// KernelAvailable reports whether the device has the gather kernel.
func (a *Auto) KernelAvailable() bool { return a.hasKernel }

// CrossoverBytes is the crossover in use.
func (a *Auto) CrossoverBytes() int64 { return a.crossover }

// Choice reports how lifecycle lg's pages move; false before Configure or
// for an unknown lifecycle.
func (a *Auto) Choice(lg layout.LayerGroupID) (Choice, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.choice[lg]
	return c, ok
}

// Configure configures the default codec with every group, chooses per
// lifecycle and configures the gather codec if any lifecycle chose it.
func (a *Auto) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.configured {
		return false
	}
	a.configured = true
	if !a.dma.Configure(gpuDescs) {
		return false
	}
	choice := make(map[layout.LayerGroupID]Choice)
	anyKernel := false
	for _, g := range gpuDescs {
		c := Choose(g, a.crossover, a.kernel != nil || a.staged != nil)
		if c == Kernel && a.staged != nil {
			c = Staged
		}
		anyKernel = anyKernel || c != DMA
		for _, lc := range g.LifeCycles {
			choice[lc] = c
		}
	}
	small := codec.ColdPageCodec(a.kernel)
	if a.staged != nil {
		small = a.staged
	}
	if anyKernel && !small.Configure(gpuDescs) {
		for lc := range choice {
			choice[lc] = DMA
		}
	}
	a.choice = choice
	return true
}

func (a *Auto) pick(lg layout.LayerGroupID) codec.ColdPageCodec {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch a.choice[lg] {
	case Kernel:
		return a.kernel
	case Staged:
		return a.staged
	}
	return a.dma
}

// QueryColdPageBytes is the default codec's (the formats are the same).
func (a *Auto) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	return a.dma.QueryColdPageBytes(lg)
}

// GetBatchingLayerGroupID is the identity for known lifecycles.
func (a *Auto) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	return a.dma.GetBatchingLayerGroupID(lg)
}

// QueryPageIndexLocation is Device for kernel lifecycles, Host for DMA and
// staged ones.
func (a *Auto) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	return a.pick(lg).QueryPageIndexLocation(lg)
}

// Encode forwards to the lifecycle's codec.
func (a *Auto) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return a.pick(lg).Encode(lg, dstBase, idx, stream)
}

// Decode forwards to the lifecycle's codec.
func (a *Auto) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return a.pick(lg).Decode(lg, srcBase, idx, stream)
}

// Close destroys both codecs. The owner must have waited for their stream
// work.
func (a *Auto) Close() error {
	var errs []error
	errs = append(errs, codec.Destroy(a.dma))
	if a.kernel != nil {
		errs = append(errs, codec.Destroy(a.kernel))
	}
	if a.staged != nil {
		errs = append(errs, a.staged.Close())
	}
	return errors.Join(errs...)
}

// MultiStream is true: each of Auto's choices is.
func (a *Auto) MultiStream() bool { return true }

// Identity is the default codec's: all of Auto's choices write its bytes.
func (a *Auto) Identity() string { return codec.ConcatIdentity }
