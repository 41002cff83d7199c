// Package gpucodec holds kvcm's built-in GPU cold-page codecs, CUDA kernels
// from kernels/ loaded as PTX on a core/device/cuda Device:
//
//   - Gather (NewGather): lossless. Its cold format is the default codec's
//     (each cold page is the concatenation of the page's slots in every pool
//     of its hot group), but the page indices stay on the device
//     (QueryPageIndexLocation = Device) and one kernel moves every page of a
//     call: each pair is fetched with one aligned 64-bit load, pages are
//     split into tiles of at most 4 KiB per pool, and a warp moves a tile
//     with 16-byte loads, several in flight per lane, which keeps mapped
//     pinned host memory busy across PCIe. Layouts not aligned to 16 bytes
//     fall back to a byte-wise kernel.
//   - Auto (NewAuto): per lifecycle, DMA (the default codec) or, below a
//     measured crossover of the lifecycle's chunk size (mean slot bytes per
//     pool), the staged codec (core/codec/staged) over Gather: pages
//     gathered into device staging, then moved by DMA in contiguous chunks,
//     so eviction and onboarding both use the copy engines at once
//     (StagedCrossoverBytes). AutoOptions.Staging StageNever keeps Gather
//     itself below AutoCrossoverBytes (no staging memory); StageAlways
//     stages on every device, over the default codec's device copies on the
//     emulated device. On the emulated device, or without cgo, it is
//     otherwise the default codec.
//   - Quant (NewQuant): a fixed-ratio lossy codec for fp16 or bf16 pages:
//     FP8 e4m3 with one float32 scale per block of BlockElems elements (128
//     by default: 0.516 of the hot bytes). Its error against the original is
//     bounded per element by ErrorBound.
//
// New makes any of them, or the default codec, from a Spec (what the C ABI's
// kvcm_create_builtin_cold_page_codec records) on a given device; Gather and
// Quant have no emulation, so on any device other than a CUDA one New fails
// with ErrNeedsCUDA.
//
// Both implement codec.ColdPageCodec and io.Closer. Calls validate what the
// host can see (configured, known lifecycle, Device indices, a stream of the
// codec's own cuda device, non-null and aligned pointers) and return false
// with nothing enqueued otherwise. Index values are only visible on the
// device: a pair whose hot slot is outside its group or whose cold page is
// negative is skipped by the kernel, and a check enqueued after the kernel
// (cuda.Stream.HostCheck: one host function for the checks of consecutive
// calls) fails the stream with an error wrapping codec.ErrBadIndex, the device
// package's asynchronous failure model. Batching is the identity.
//
// The kernel codecs need cgo and a GPU at run time; without cgo the package
// holds only Auto (then always DMA), and the GPU tests skip where there is
// no GPU.
package gpucodec
