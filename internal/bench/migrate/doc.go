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
// The benchmark needs cgo and a CUDA GPU; Main reports an error elsewhere.
package migrate
