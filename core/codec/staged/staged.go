// Package staged is the staged cold-page codec: DMA efficiency at small
// pages, in both directions at once.
//
// Copying many small scattered pages across PCIe costs a DMA descriptor (or
// a kernel's mapped-memory traffic, which does not overlap a second
// direction) per page and pool. Staged instead gathers a chunk of scattered
// pages, with a device-side codec (the gather kernel on CUDA, device-to-device
// batch copies elsewhere), into contiguous cold pages in a device staging
// ring, and moves the chunk to host memory with one DMA descriptor per run of
// consecutive destination pages; decode is the mirror (DMA into device
// staging, then scatter on the device). The DMA runs on a copy stream of the
// codec's own per caller stream (Options.Serial: on the caller's stream), so
// one chunk's DMA overlaps the next chunk's gather, and the copy engines of
// the two directions work at the same time when evictions and onboardings
// run on two streams. The call's work starts after the caller's earlier
// work, the caller's stream waits for all of it, and every asynchronous
// failure of it reaches the caller's stream's current failure interval.
//
// Staging follows core/staging's rules: one device ring per stream that calls
// the codec (so the two directions never wait for each other's staging),
// next-fit over live and retired ranges, a retired range keeping the event of
// the stream work that last used it; a stream acquiring a range waits for
// that event on the device, never on the host.
package staged

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/core/staging"
)

// DefaultChunkBytes is the most bytes one chunk moves by DMA (~1.2 ms on
// PCIe gen5), at every page size (a device-index inner codec gets a chunk in
// calls of at most the index batch cap). A chunk costs the host ~70 µs of
// driver calls on the H200 (event records, index uploads, the DMA, the
// gather launches and the flush of their batched index checks), and in duplex
// traffic one direction's submission delays the other's start, so the chunk
// must dwarf that cost; a descriptor's fixed cost (~0.4 µs, EVALUATION.md §1)
// is negligible beside it. On the H200, with both directions at once, 4 KiB
// pages moved 0.92–0.94 of the two-stream limit with 64 MiB chunks in a ring
// of two and 0.85–0.90 with 32 MiB (16 KiB to 1 MiB: 0.93–0.97); 128 MiB
// chunks measured 0.94–0.98 at twice the device memory (docs/benchmarks.md).
const DefaultChunkBytes = 64 << 20

// DefaultRingChunks is how many chunks one stream's device ring holds: two,
// so a chunk's gather (or scatter) overlaps the DMA of the chunk before it
// (rings of three or four measured no better): 128 MiB of device memory per
// caller stream.
const DefaultRingChunks = 2

// Options configure New. Zero fields take the defaults.
type Options struct {
	// ChunkBytes is the most bytes one chunk stages; a chunk holds at least
	// one cold page.
	ChunkBytes int64
	// RingChunks is the device ring of each stream in chunks.
	RingChunks int
	// Serial runs each chunk's DMA on the caller's stream, after its gather
	// (before its scatter). By default the DMA runs on a copy stream of the
	// codec's own per caller stream, so one chunk's DMA overlaps the next
	// chunk's gather (the previous chunk's scatter); the call's work still
	// starts after the caller's stream's earlier work and the caller's
	// stream waits for all of it, so it is ordered as work on that stream.
	Serial bool
}

// Codec is the staged codec over an inner device-side codec. Its cold
// format is the inner codec's; its indices are host indices (it builds DMA
// descriptors from them), which it rewrites for the inner codec and uploads
// when the inner codec reads device indices. Not safe for concurrent use:
// the manager serializes calls.
type Codec struct {
	dev   device.Device
	inner codec.ColdPageCodec
	opts  Options
	// rings are the per-stream staging, by stream handle, made on first use.
	rings  map[uintptr]*streamRing
	closed bool

	// Scratch reused by every call: pairs sorted by cold page, the inner
	// codec's pairs, their bytes on a big-endian host, the DMA descriptors.
	pairs, innerPairs []codec.PageIndexPair
	buf               []byte
	descs             []device.CopyDesc
	// marks are the events recorded during a call, which the caller's
	// stream waits on at its end (see mark); free are spare events.
	marks, free []device.Event
}

// streamRing is the staging of one caller stream and its copy stream (the
// caller stream itself with Options.Serial).
type streamRing struct {
	pages *staging.Ring
	idx   *staging.IndexRing
	copy  device.Stream
	owned bool // copy is the codec's own stream
}

var _ codec.ColdPageCodec = (*Codec)(nil)

// New wraps inner, which must accept a device-memory cold base (the gather
// kernel codec, the default codec on a device whose batch copies reach
// device memory). The codec owns inner: Close destroys it.
func New(dev device.Device, inner codec.ColdPageCodec, opts Options) (*Codec, error) {
	switch {
	case dev == nil:
		return nil, errors.New("staged: nil device")
	case inner == nil:
		return nil, errors.New("staged: nil inner codec")
	case opts.ChunkBytes < 0:
		return nil, fmt.Errorf("staged: ChunkBytes %d must not be negative", opts.ChunkBytes)
	case opts.RingChunks < 0:
		return nil, fmt.Errorf("staged: RingChunks %d must not be negative", opts.RingChunks)
	}
	if opts.ChunkBytes == 0 {
		opts.ChunkBytes = DefaultChunkBytes
	}
	if opts.RingChunks == 0 {
		opts.RingChunks = DefaultRingChunks
	}
	return &Codec{dev: dev, inner: inner, opts: opts, rings: map[uintptr]*streamRing{}}, nil
}

// Inner is the wrapped codec.
func (c *Codec) Inner() codec.ColdPageCodec { return c.inner }

// Configure configures the inner codec.
func (c *Codec) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	return !c.closed && c.inner.Configure(gpuDescs)
}

// QueryColdPageBytes is the inner codec's.
func (c *Codec) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	return c.inner.QueryColdPageBytes(lg)
}

// GetBatchingLayerGroupID is the inner codec's.
func (c *Codec) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	return c.inner.GetBatchingLayerGroupID(lg)
}

// QueryPageIndexLocation is Host for every lifecycle the inner codec knows.
func (c *Codec) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	if c.inner.QueryPageIndexLocation(lg) == codec.BadLocation {
		return codec.BadLocation
	}
	return codec.Host
}

// Identity is the inner codec's cold-format identity ("" when it has none):
// staging changes where bytes travel, not the bytes.
func (c *Codec) Identity() string {
	id, _ := codec.IdentityOf(c.inner)
	return id
}

// Encode enqueues on stream, chunk by chunk, the inner encode of hot slots
// idx[i].Src into device staging and the DMA of the staged pages to dstBase
// + idx[i].Dst*QueryColdPageBytes(lg). Chunks are in order of destination
// page, so consecutive pages go in one descriptor. A false result after the
// first chunk leaves the earlier chunks enqueued: the caller drains the
// stream, as after any failed call.
func (c *Codec) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return c.run(lg, dstBase, idx, stream, true)
}

// Decode enqueues on stream, chunk by chunk, the DMA of cold pages srcBase +
// idx[i].Src*QueryColdPageBytes(lg) into device staging and the inner decode
// from staging into hot slots idx[i].Dst.
func (c *Codec) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return c.run(lg, srcBase, idx, stream, false)
}

// mark records an event on s that the caller's stream waits on when the call
// ends. Every Record on a stream closes its failure interval (package
// device), and a call records mid-way (staging leases record when they
// change owner or end): marking first keeps each failure in a marked
// interval, and the final waits bring them all into the caller's stream's
// current interval, where the caller's own finish event finds them.
func (c *Codec) mark(s device.Stream) bool {
	var ev device.Event
	if n := len(c.free); n > 0 {
		ev, c.free = c.free[n-1], c.free[:n-1]
	} else {
		var err error
		if ev, err = c.dev.NewEvent(); err != nil {
			return false
		}
	}
	if s.Record(ev) != nil {
		c.free = append(c.free, ev)
		return false
	}
	c.marks = append(c.marks, ev)
	return true
}

// joinMarks makes stream wait on every mark of the call; the events are
// free again at once (a later Record does not affect an enqueued wait).
func (c *Codec) joinMarks(stream device.Stream) bool {
	ok := true
	for _, ev := range c.marks {
		ok = stream.Wait(ev) == nil && ok
	}
	c.free = append(c.free, c.marks...)
	clear(c.marks)
	c.marks = c.marks[:0]
	return ok
}

// coldOrder is pairs in order of cold page, the order of the chunks: pairs
// itself when already in order (the manager allocates cold pages in order),
// else a sorted copy. False for a negative index.
func (c *Codec) coldOrder(pairs []codec.PageIndexPair, toCold bool) ([]codec.PageIndexPair, bool) {
	cold := func(p codec.PageIndexPair) int32 {
		if toCold {
			return p.Dst
		}
		return p.Src
	}
	inOrder, prev := true, int32(0)
	for _, p := range pairs {
		if p.Src < 0 || p.Dst < 0 {
			return nil, false
		}
		k := cold(p)
		inOrder = inOrder && k >= prev
		prev = k
	}
	if inOrder {
		return pairs, true
	}
	c.pairs = append(c.pairs[:0], pairs...)
	slices.SortStableFunc(c.pairs, func(a, b codec.PageIndexPair) int { return cmp.Compare(cold(a), cold(b)) })
	return c.pairs, true
}

func (c *Codec) run(lg layout.LayerGroupID, coldBase device.Ptr, idx codec.PageIndices, stream device.Stream, toCold bool) bool {
	if c.closed || stream == nil || idx.Location() != codec.Host || coldBase == 0 {
		return false
	}
	stride := c.inner.QueryColdPageBytes(lg)
	loc := c.inner.QueryPageIndexLocation(lg)
	if stride <= 0 || loc == codec.BadLocation {
		return false
	}
	pairs := idx.Host()
	if len(pairs) == 0 {
		return true
	}
	sorted, ok := c.coldOrder(pairs, toCold)
	if !ok {
		return false
	}
	sr, err := c.ring(stream, stride)
	if err != nil {
		return false
	}
	if sr.copy != stream {
		// The copy stream starts after the caller's earlier work (the
		// manager's waits on the slots' fences among it).
		ok = c.mark(stream) && sr.copy.Wait(c.marks[len(c.marks)-1]) == nil
	}
	perChunk := max(c.opts.ChunkBytes/stride, 1)
	for ok && len(sorted) > 0 {
		n := min(int64(len(sorted)), perChunk)
		req, err := staging.PageRequest(stride, 1, n)
		if err != nil {
			ok = false
			break
		}
		// Encode stages on the caller's stream, decode on the copy stream:
		// the stream that writes the staging first owns the lease.
		first := stream
		if !toCold {
			first = sr.copy
		}
		lease, err := sr.pages.Acquire(req, first)
		if err != nil {
			ok = false
			break
		}
		k := int(lease.Size() / stride)
		ok = c.chunk(lg, sr, lease, coldBase, stride, sorted[:k], loc, stream, toCold)
		// Released after the chunk's work is enqueued (and marked): the lease
		// records its event on its owner, which protects the bytes until
		// that work is done.
		ok = lease.Release() == nil && ok
		sorted = sorted[k:]
	}
	return c.joinMarks(stream) && ok
}

// chunk enqueues one chunk: pairs' pages staged in lease, in order; encode
// gathers on stream and copies on sr.copy, decode copies on sr.copy and
// scatters on stream.
func (c *Codec) chunk(lg layout.LayerGroupID, sr *streamRing, lease *staging.StagingBuffer, coldBase device.Ptr, stride int64,
	pairs []codec.PageIndexPair, loc codec.PageIndexLocation, stream device.Stream, toCold bool) bool {
	stage := lease.Ptr()
	// The inner codec's pairs: staged page i on the cold side. One pass
	// builds them and the descriptors, one per run of consecutive cold
	// pages: at 4 KiB pages this loop is most of a call's host time, which
	// delays the other direction's submission in duplex traffic.
	inner := slices.Grow(c.innerPairs[:0], len(pairs))[:len(pairs)]
	c.innerPairs = inner
	descs := c.descs[:0]
	start, runPage := 0, int32(0) // the current run: first pair and its cold page
	for i, p := range pairs {
		var page int32
		if toCold {
			page = p.Dst
			inner[i] = codec.PageIndexPair{Dst: int32(i), Src: p.Src}
		} else {
			page = p.Src
			inner[i] = codec.PageIndexPair{Dst: p.Dst, Src: int32(i)}
		}
		if i == 0 || page != runPage+int32(i-start) {
			if i > 0 {
				descs = append(descs, runDesc(coldBase, stage, stride, runPage, start, i, toCold))
			}
			start, runPage = i, page
		}
	}
	descs = append(descs, runDesc(coldBase, stage, stride, runPage, start, len(pairs), toCold))
	c.descs = descs
	// dma moves the chunk on the copy stream, owner of the lease after it.
	dma := func() bool {
		return lease.SetStream(sr.copy) == nil && sr.copy.BatchCopy(descs) == nil && c.mark(sr.copy)
	}
	if !toCold && !dma() {
		return false
	}
	if !toCold && lease.SetStream(stream) != nil {
		return false
	}
	ok := true
	if loc == codec.Host {
		ok = c.innerCall(lg, stage, codec.HostIndices(inner), stream, toCold) && c.mark(stream)
	}
	// A device-index inner codec takes at most the index batch cap per call,
	// so a chunk (64 MiB: 16384 pages of 4 KiB) is several calls over one
	// staging lease, each on its own uploaded slice of the pairs.
	for i := 0; ok && loc == codec.Device && i < len(inner); i += staging.MaxIndexBatchPairs {
		piece := inner[i:min(i+staging.MaxIndexBatchPairs, len(inner))]
		idxLease, err := sr.idx.Upload(codec.PairBytes(piece, &c.buf), stream)
		if err != nil {
			return false
		}
		ok = c.innerCall(lg, stage, codec.DeviceIndices(idxLease.Ptr(), len(piece)), stream, toCold) && c.mark(stream)
		ok = idxLease.Release() == nil && ok
	}
	if toCold && ok {
		ok = dma()
	}
	return ok
}

// innerCall is the inner codec's call between the hot slots and staging.
func (c *Codec) innerCall(lg layout.LayerGroupID, stage device.Ptr, ix codec.PageIndices, stream device.Stream, toCold bool) bool {
	if toCold {
		return c.inner.Encode(lg, stage, ix, stream)
	}
	return c.inner.Decode(lg, stage, ix, stream)
}

// runDesc is the DMA of staged pairs [from, to), whose cold pages are
// consecutive from page.
func runDesc(coldBase, stage device.Ptr, stride int64, page int32, from, to int, toCold bool) device.CopyDesc {
	staged, far := stage.Add(int64(from)*stride), coldBase.Add(int64(page)*stride)
	d := device.CopyDesc{Dst: staged, Src: far, Size: int64(to-from) * stride}
	if toCold {
		d.Dst, d.Src = far, staged
	}
	return d
}

// ring is stream's staging, made on first use with room for RingChunks
// chunks of at least one page of stride.
func (c *Codec) ring(stream device.Stream, stride int64) (*streamRing, error) {
	if sr, ok := c.rings[stream.Handle()]; ok && sr.pages.Capacity() >= stride {
		return sr, nil
	}
	chunk := max(c.opts.ChunkBytes/stride, 1) * stride
	pages, err := staging.NewRing(c.dev, device.DeviceMemory, chunk*int64(c.opts.RingChunks)+staging.PageAlignment(stride))
	if err != nil {
		return nil, fmt.Errorf("staged: device staging ring: %w", err)
	}
	idx, err := staging.NewIndexRing(c.dev, 0)
	if err != nil {
		return nil, errors.Join(err, pages.Close())
	}
	sr := &streamRing{pages: pages, idx: idx, copy: stream}
	if !c.opts.Serial {
		if sr.copy, err = c.dev.NewStream(); err != nil {
			return nil, errors.Join(fmt.Errorf("staged: copy stream: %w", err), sr.close())
		}
		sr.owned = true
	}
	if old, ok := c.rings[stream.Handle()]; ok {
		// A larger page than the ring was made for: the old ring's work
		// finishes before it is freed (Close synchronizes its events).
		if err := old.close(); err != nil {
			return nil, errors.Join(err, sr.close())
		}
	}
	c.rings[stream.Handle()] = sr
	return sr, nil
}

// close frees the staging after its work; the copy stream goes last, so
// the rings' events recorded on it complete first.
func (sr *streamRing) close() error {
	errs := []error{sr.pages.Close(), sr.idx.Close()}
	if sr.owned {
		errs = append(errs, sr.copy.Synchronize(), sr.copy.Close())
	}
	return errors.Join(errs...)
}

// MultiStream is the inner codec's: the staging is per stream.
func (c *Codec) MultiStream() bool { return codec.IsMultiStream(c.inner) }

// Close frees the staging rings, after their work, and destroys the inner
// codec. It is idempotent.
func (c *Codec) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, sr := range c.rings {
		errs = append(errs, sr.close())
	}
	c.rings = nil
	for _, ev := range c.free {
		errs = append(errs, ev.Close())
	}
	c.free = nil
	errs = append(errs, codec.Destroy(c.inner))
	return errors.Join(errs...)
}
