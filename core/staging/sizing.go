package staging

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvcm/kvcm/core/device"
)

const (
	// MinPageRingBytes is the floor of the pinned page ring size (64 MiB).
	MinPageRingBytes int64 = 64 << 20
	// PageRingCopies is how many maximal cold pages the page ring holds at
	// least, so staging of consecutive pages can overlap.
	PageRingCopies int64 = 3
	// MaxPageAlignment caps the address alignment PageRequest chooses for
	// disk staging (the common direct-I/O block size).
	MaxPageAlignment int64 = 4096

	// PageIndexPairBytes is sizeof(PageIndexPair): int32 dst, int32 src,
	// 8-byte aligned.
	PageIndexPairBytes int64 = 8
	// MaxIndexBatchBytes is the kMaxIndexBatchBytes scheduling cap: a codec
	// call never receives more than this many bytes of index pairs.
	MaxIndexBatchBytes int64 = 64 << 10
	// MaxIndexBatchPairs is MaxIndexBatchBytes in PageIndexPairs (8192).
	MaxIndexBatchPairs = int(MaxIndexBatchBytes / PageIndexPairBytes)
	// IndexRingBatches is how many maximal batches the device index ring
	// holds, so the H2D copy of one batch overlaps codec work on others.
	IndexRingBatches int64 = 4
	// DefaultIndexRingBytes is the default device index ring size (256 KiB).
	DefaultIndexRingBytes = IndexRingBatches * MaxIndexBatchBytes
)

// ErrBadPageSize: a cold-page size is not positive (a codec's zero
// queryColdPageBytes result signals failure).
var ErrBadPageSize = errors.New("staging: cold-page size must be positive")

// PageRingBytes is the pinned page ring size for the largest cold page of
// all lifecycles: max(64 MiB, 3*maxColdPageBytes), with checked
// multiplication. maxColdPageBytes must be positive; an overflowing product
// is an error.
func PageRingBytes(maxColdPageBytes int64) (int64, error) {
	if maxColdPageBytes <= 0 {
		return 0, fmt.Errorf("%w: got %d", ErrBadPageSize, maxColdPageBytes)
	}
	if maxColdPageBytes > math.MaxInt64/PageRingCopies {
		return 0, fmt.Errorf("staging: page ring size %d * %d overflows int64", PageRingCopies, maxColdPageBytes)
	}
	return max(MinPageRingBytes, PageRingCopies*maxColdPageBytes), nil
}

// NewPageRing allocates the pinned (host-mapped) page ring sized by
// PageRingBytes(maxColdPageBytes).
func NewPageRing(dev device.Device, maxColdPageBytes int64) (*Ring, error) {
	n, err := PageRingBytes(maxColdPageBytes)
	if err != nil {
		return nil, err
	}
	return NewRing(dev, device.HostMapped, n)
}

// PageAlignment is the address alignment used for disk staging of pages of
// pageBytes: the largest power of two dividing pageBytes, capped at
// MaxPageAlignment, so pageBytes is always a multiple of it. pageBytes must be
// positive.
func PageAlignment(pageBytes int64) int64 {
	return min(pageBytes&-pageBytes, MaxPageAlignment)
}

// PageRequest is the Request for between minPages and maxPages cold pages of
// pageBytes each: granularity pageBytes, alignment PageAlignment(pageBytes).
func PageRequest(pageBytes, minPages, maxPages int64) (Request, error) {
	if pageBytes <= 0 {
		return Request{}, fmt.Errorf("%w: got %d", ErrBadPageSize, pageBytes)
	}
	if minPages <= 0 || maxPages < minPages {
		return Request{}, fmt.Errorf("%w: page counts [%d, %d] (need 0 < min <= max)", ErrInvalidRequest, minPages, maxPages)
	}
	if maxPages > math.MaxInt64/pageBytes {
		return Request{}, fmt.Errorf("%w: %d pages of %d bytes overflow int64", ErrInvalidRequest, maxPages, pageBytes)
	}
	return Request{
		Min:         minPages * pageBytes,
		Max:         maxPages * pageBytes,
		Granularity: pageBytes,
		Alignment:   PageAlignment(pageBytes),
	}, nil
}

// IndexChunk is a contiguous run of PageIndexPairs handed to one codec call:
// pairs [Start, Start+Count).
type IndexChunk struct {
	Start, Count int
}

// Bytes is the chunk's size in bytes; at most MaxIndexBatchBytes.
func (c IndexChunk) Bytes() int64 { return int64(c.Count) * PageIndexPairBytes }

// IndexChunks splits numPairs PageIndexPairs, in order, into chunks of at most
// MaxIndexBatchBytes (MaxIndexBatchPairs pairs); every chunk but the last is
// full. It returns nil for numPairs <= 0.
func IndexChunks(numPairs int) []IndexChunk {
	if numPairs <= 0 {
		return nil
	}
	chunks := make([]IndexChunk, 0, (numPairs-1)/MaxIndexBatchPairs+1)
	for start := 0; ; start += MaxIndexBatchPairs {
		rest := numPairs - start
		chunks = append(chunks, IndexChunk{Start: start, Count: min(MaxIndexBatchPairs, rest)})
		if rest <= MaxIndexBatchPairs {
			break
		}
	}
	return chunks
}
