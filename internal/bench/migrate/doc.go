// Package migrate is the migration-throughput benchmark of kvcm (the logic
// behind `kvcm bench migrate`; EVALUATION.md §1).
//
// For each codec (the default DMA codec, the device-index gather kernel codec,
// the FP8 quantizing codec) and each chunk size C (the bytes of one page in
// one pool), it moves TotalBytes between N scattered slots of P device pools
// (N = TotalBytes/(P*C), a random permutation of the slots) and N cold pages
// in one mapped pinned host buffer, and prints encode (device to host) and
// decode (host to device) GB/s of hot bytes, the contiguous-copy limit
// measured in the same process (one descriptor of TotalBytes each way), their
// ratio, the host time spent submitting (per descriptor for DMA, per page for
// kernels), and for the default codec the same descriptors submitted raw to
// the driver (cuda.RawBatch) in the same process, interleaved run by run: the
// driver's arrays written from the index pairs right before each call (as a
// C++ codec does; the reference of the table) and, in the JSON, arrays built
// once before timing.
// Kernel codecs upload their page indices as the manager does: one
// CopyFromHost of at most IndexChunkPairs pairs (64 KiB) before each codec
// call, inside the timed region.
//
// Every copied byte is verified before timing: after one encode, every cold
// page against the source slots (lossless codecs); after poisoning the hot
// pools and one decode, every hot byte against the original (lossless), or
// every element against gpucodec.ErrorBound (quantizing). Times are the median
// of Runs runs measured with CUDA events, after one warm-up run.
//
// Duplex mode (-duplex, EVALUATION.md §1b; RunDuplex) moves TotalBytes down
// (encode, GPU→host) on one stream while DuplexUpBytes come up (decode,
// host→GPU) on another, from and into disjoint scattered slots of the same
// pools, and prints the aggregate GB/s beside the two-stream contiguous DMA
// limit (one descriptor per pool each way, both at once), each direction
// alone beside its own contiguous limit, and the ratios, all measured in the
// same run. It measures the default, gather and staged codecs (the staged
// codec over the gather kernel: device staging, then DMA of contiguous
// chunks) on CUDA, and the default and staged codecs (over the default
// codec) on the emulated device. Both directions are verified byte for byte,
// run at once, before timing; times are wall clock around the submissions
// and both streams' synchronization, so host submit cost counts. Each round
// times the contiguous limit just before each codec, and a ratio is the
// median over the rounds of the codec's GB/s over that round's limit: the
// link's throughput drifts by several percent over a run, and a reference
// measured minutes earlier moved the ratios by as much.
//
// The single-direction mode needs cgo and a CUDA GPU, or measures the default
// codec on the emulated device.
package migrate
