package staging

import (
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/device"
)

// IndexAlignment is the address alignment of index staging: alignas(8) of
// PageIndexPair, so a GPU work item loads one pair with one aligned 64-bit
// load. PageIndexPairBytes is a multiple of it.
const IndexAlignment int64 = 8

// IndexRing is a StorageManager's device index ring: device memory that
// receives H2D copies of PageIndexPair arrays for codecs that consume device
// indices. It allocates nothing until the first Acquire (after codec
// configuration, and only if some lifecycle asks for device indices); a
// StorageManager whose codecs all use host indices never allocates it. Not
// safe for concurrent use.
type IndexRing struct {
	dev    device.Device
	bytes  int64
	ring   *Ring // nil until first use
	closed bool
}

// NewIndexRing prepares a lazily allocated device index ring of
// capacityBytes (0 selects DefaultIndexRingBytes, room for IndexRingBatches
// maximal batches). capacityBytes must hold at least one maximal batch
// (MaxIndexBatchBytes) and be a multiple of PageIndexPairBytes. No device
// memory is allocated here.
func NewIndexRing(dev device.Device, capacityBytes int64) (*IndexRing, error) {
	if dev == nil {
		return nil, errors.New("staging: nil device")
	}
	if capacityBytes == 0 {
		capacityBytes = DefaultIndexRingBytes
	}
	if capacityBytes < MaxIndexBatchBytes || capacityBytes%PageIndexPairBytes != 0 {
		return nil, fmt.Errorf("staging: index ring capacity %d must be a multiple of %d and at least MaxIndexBatchBytes %d",
			capacityBytes, PageIndexPairBytes, MaxIndexBatchBytes)
	}
	return &IndexRing{dev: dev, bytes: capacityBytes}, nil
}

// Allocated reports whether the device ring has been allocated.
func (x *IndexRing) Allocated() bool { return x.ring != nil }

// Capacity is the ring size in bytes (allocated or not).
func (x *IndexRing) Capacity() int64 { return x.bytes }

// Ring is the underlying ring, or nil before the first Acquire.
func (x *IndexRing) Ring() *Ring { return x.ring }

// Acquire leases room for between minPairs and maxPairs PageIndexPairs
// (granularity PageIndexPairBytes, alignment IndexAlignment), owned by stream
// (normally the codec stream; nil for synchronous ownership). maxPairs must
// not exceed MaxIndexBatchPairs: larger batches are split with IndexChunks
// first. The first call allocates the device ring; if that fails the ring
// stays unallocated and a later call retries. Otherwise it behaves as
// Ring.Acquire (ErrRingFull instead of waiting under capacity pressure).
func (x *IndexRing) Acquire(minPairs, maxPairs int, stream device.Stream) (*StagingBuffer, error) {
	if x.closed {
		return nil, ErrClosed
	}
	if minPairs <= 0 || maxPairs < minPairs || maxPairs > MaxIndexBatchPairs {
		return nil, fmt.Errorf("%w: index pairs [%d, %d] (need 0 < min <= max <= MaxIndexBatchPairs %d; split with IndexChunks)",
			ErrInvalidRequest, minPairs, maxPairs, MaxIndexBatchPairs)
	}
	if x.ring == nil {
		r, err := NewRing(x.dev, device.DeviceMemory, x.bytes)
		if err != nil {
			return nil, fmt.Errorf("staging: allocating the device index ring: %w", err)
		}
		x.ring = r
	}
	return x.ring.Acquire(Request{
		Min:         int64(minPairs) * PageIndexPairBytes,
		Max:         int64(maxPairs) * PageIndexPairBytes,
		Granularity: PageIndexPairBytes,
		Alignment:   IndexAlignment,
	}, stream)
}

// Upload stages one codec chunk of PageIndexPairs on stream: it acquires a
// slice of exactly len(pairs) bytes owned by stream and enqueues
// stream.CopyFromHost of pairs into it. pairs is ordinary host memory,
// consumed before Upload returns, so the caller may reuse it at once. pairs
// must be a positive multiple of PageIndexPairBytes long and at most
// MaxIndexBatchBytes (split with IndexChunks); stream must not be nil. The
// caller passes the returned slice's Ptr to the codec, enqueues the codec work
// on stream and then releases the slice, whose event then covers the copy and
// the codec work. On a synchronous copy error the slice is released and the
// error returned.
func (x *IndexRing) Upload(pairs []byte, stream device.Stream) (*StagingBuffer, error) {
	if stream == nil {
		return nil, fmt.Errorf("%w: index upload needs a stream", ErrInvalidRequest)
	}
	n := int64(len(pairs))
	if n == 0 || n%PageIndexPairBytes != 0 {
		return nil, fmt.Errorf("%w: %d index bytes is not a positive multiple of %d", ErrInvalidRequest, n, PageIndexPairBytes)
	}
	np := int(n / PageIndexPairBytes)
	b, err := x.Acquire(np, np, stream)
	if err != nil {
		return nil, err
	}
	if err := stream.CopyFromHost(b.Ptr(), pairs); err != nil {
		return nil, errors.Join(fmt.Errorf("staging: index upload: %w", err), b.Release())
	}
	return b, nil
}

// Close closes the device ring if it was allocated (see Ring.Close: refused
// with ErrLiveLeases while leases are live). Closing twice returns ErrClosed.
func (x *IndexRing) Close() error {
	if x.closed {
		return ErrClosed
	}
	var err error
	if x.ring != nil {
		if err = x.ring.Close(); errors.Is(err, ErrLiveLeases) {
			return err
		}
	}
	x.closed = true
	return err
}
