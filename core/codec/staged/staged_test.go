package staged_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/staged"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/core/staging"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

const (
	pools = 3
	slots = 64
	chunk = 512 // bytes of one page in one pool
	page  = pools * chunk
)

// rig is an emulated device with hot pools, a host cold buffer and the
// image the pools were filled with.
type rig struct {
	t     *testing.T
	dev   *emu.Device
	hot   []device.Memory
	cold  device.Memory
	image [][]byte
	desc  layout.PoolGroupDesc
	slots int64
}

func newRig(t *testing.T, opts emu.Options) *rig { return newRigOf(t, opts, slots) }

// newRigOf is a rig of n slots a pool.
func newRigOf(t *testing.T, opts emu.Options, n int64) *rig {
	r := &rig{t: t, dev: emu.New(opts), slots: n}
	t.Cleanup(func() { r.dev.Close() })
	r.desc = layout.PoolGroupDesc{Index: 0, NumSlots: r.slots, LifeCycles: []layout.LayerGroupID{0}}
	rng := rand.New(rand.NewPCG(1, 2))
	for range pools {
		m, err := r.dev.Alloc(device.DeviceMemory, r.slots*chunk)
		require.NoError(t, err)
		img := make([]byte, r.slots*chunk)
		for i := range img {
			img[i] = byte(rng.Uint32())
		}
		r.hot = append(r.hot, m)
		r.image = append(r.image, img)
		r.desc.Pools = append(r.desc.Pools, layout.PoolDesc{Base: m.Ptr(), SlotBytes: chunk})
	}
	var err error
	r.cold, err = r.dev.Alloc(device.HostMapped, r.slots*page)
	require.NoError(t, err)
	s := r.stream()
	for p, m := range r.hot {
		require.NoError(t, s.CopyFromHost(m.Ptr(), r.image[p]))
	}
	require.NoError(t, s.Synchronize())
	return r
}

func (r *rig) stream() device.Stream {
	s, err := r.dev.NewStream()
	require.NoError(r.t, err)
	r.t.Cleanup(func() { s.Close() })
	return s
}

func (r *rig) codec(inner codec.ColdPageCodec, opts staged.Options) *staged.Codec {
	c, err := staged.New(r.dev, inner, opts)
	require.NoError(r.t, err)
	r.t.Cleanup(func() { codec.Destroy(c) })
	require.True(r.t, c.Configure([]layout.PoolGroupDesc{r.desc}))
	return c
}

// readHot is pool p's bytes now.
func (r *rig) readHot(s device.Stream, p int) []byte {
	back, err := r.dev.Alloc(device.HostMapped, r.slots*chunk)
	require.NoError(r.t, err)
	defer back.Free()
	require.NoError(r.t, s.BatchCopy([]device.CopyDesc{{Dst: back.Ptr(), Src: r.hot[p].Ptr(), Size: r.slots * chunk}}))
	require.NoError(r.t, s.Synchronize())
	return append([]byte(nil), back.Host()...)
}

// requireCold checks that cold page pr.Dst holds hot slot pr.Src of every
// pool, concatenated: the default codec's format.
func (r *rig) requireCold(pairs []codec.PageIndexPair) {
	for _, pr := range pairs {
		for p := range pools {
			want := r.image[p][int64(pr.Src)*chunk:][:chunk]
			got := r.cold.Host()[int64(pr.Dst)*page+int64(p)*chunk:][:chunk]
			require.Equal(r.t, want, got, "cold page %d pool %d", pr.Dst, p)
		}
	}
}

// scatter is n pairs moving hot slots first.. to cold pages in a random
// order, and their mirror.
func scatter(first, n int, seed uint64) (enc, dec []codec.PageIndexPair) {
	rng := rand.New(rand.NewPCG(seed, 3))
	for i, s := range rng.Perm(n) {
		enc = append(enc, codec.PageIndexPair{Dst: int32(first + i), Src: int32(first + s)})
		dec = append(dec, codec.PageIndexPair{Dst: int32(first + s), Src: int32(first + i)})
	}
	return enc, dec
}

// poison overwrites the hot slots dec writes.
func (r *rig) poison(s device.Stream, dec []codec.PageIndexPair) {
	junk := make([]byte, chunk)
	for i := range junk {
		junk[i] = 0xee
	}
	for _, pr := range dec {
		for p := range pools {
			require.NoError(r.t, s.CopyFromHost(r.hot[p].Ptr().Add(int64(pr.Dst)*chunk), junk))
		}
	}
	require.NoError(r.t, s.Synchronize())
}

func (r *rig) requireHot(s device.Stream) {
	for p := range pools {
		require.Equal(r.t, r.image[p], r.readHot(s, p), "pool %d", p)
	}
}

// The staged codec writes the inner codec's cold format to the byte and
// decodes it back, with host-indexed and device-indexed inner codecs, in
// chunks smaller than the call that reuse a ring smaller than the call,
// under random stream delays.
func TestStagedRoundTripsInChunksThroughASmallRing(t *testing.T) {
	for name, inner := range map[string]func(d device.Device) codec.ColdPageCodec{
		"host indices":   func(device.Device) codec.ColdPageCodec { return codec.NewDefault() },
		"device indices": func(d device.Device) codec.ColdPageCodec { return codectest.NewDeviceIndexed(d) },
	} {
		for _, serial := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s serial=%v", name, serial), func(t *testing.T) {
				r := newRig(t, emu.Options{Seed: 5, MaxDelay: 20e3})
				c := r.codec(inner(r.dev), staged.Options{ChunkBytes: 5 * page, RingChunks: 2, Serial: serial})
				assert.Equal(t, codec.Host, c.QueryPageIndexLocation(0))
				assert.EqualValues(t, page, c.QueryColdPageBytes(0))
				s := r.stream()
				enc, dec := scatter(0, slots, 9)
				require.True(t, c.Encode(0, r.cold.Ptr(), codec.HostIndices(enc), s))
				require.NoError(t, s.Synchronize())
				r.requireCold(enc)
				r.poison(s, dec)
				require.True(t, c.Decode(0, r.cold.Ptr(), codec.HostIndices(dec), s))
				require.NoError(t, s.Synchronize())
				r.requireHot(s)
			})
		}
	}
}

// An asynchronous failure of any chunk's work reaches the caller's stream:
// the event the caller records after the call carries it, though the call
// records events of its own between chunks.
func TestStagedChunkFailuresReachTheCallersStream(t *testing.T) {
	for _, serial := range []bool{false, true} {
		t.Run(fmt.Sprintf("serial=%v", serial), func(t *testing.T) {
			r := newRig(t, emu.Options{Seed: 8, MaxDelay: 5e3})
			c := r.codec(codectest.NewDeviceIndexed(r.dev), staged.Options{ChunkBytes: 4 * page, RingChunks: 2, Serial: serial})
			s := r.stream()
			enc, _ := scatter(0, slots, 6)
			enc[1].Src = slots + 5 // outside the group: only the device sees it, in the first chunk
			require.True(t, c.Encode(0, r.cold.Ptr(), codec.HostIndices(enc), s))
			ev, err := r.dev.NewEvent()
			require.NoError(t, err)
			defer ev.Close()
			require.NoError(t, s.Record(ev))
			assert.ErrorIs(t, ev.Synchronize(), codec.ErrBadIndex)
		})
	}
}

// An encode on one stream and a decode on another run at once, each with
// its own staging, and both move their pages to the byte.
func TestStagedEncodeAndDecodeOnTwoStreamsAtOnce(t *testing.T) {
	r := newRig(t, emu.Options{Seed: 6, MaxDelay: 20e3})
	c := r.codec(codec.NewDefault(), staged.Options{ChunkBytes: 4 * page, RingChunks: 2})
	down, up := r.stream(), r.stream()
	// Pages 32.. are on the host tier already; 0..31 go down while they
	// come up.
	encUp, decUp := scatter(slots/2, slots/2, 4)
	require.True(t, c.Encode(0, r.cold.Ptr(), codec.HostIndices(encUp), down))
	require.NoError(t, down.Synchronize())
	r.poison(down, decUp)
	encDown, _ := scatter(0, slots/2, 8)
	require.True(t, c.Encode(0, r.cold.Ptr(), codec.HostIndices(encDown), down))
	require.True(t, c.Decode(0, r.cold.Ptr(), codec.HostIndices(decUp), up))
	require.NoError(t, down.Synchronize())
	require.NoError(t, up.Synchronize())
	r.requireCold(encDown)
	r.requireHot(down)
}

// Consecutive cold pages travel in one DMA descriptor: a call whose cold
// pages are contiguous makes one descriptor per chunk, not one per page.
func TestStagedCoalescesConsecutiveColdPages(t *testing.T) {
	r := newRig(t, emu.Options{})
	c := r.codec(codec.NewDefault(), staged.Options{ChunkBytes: slots * page})
	s := r.stream()
	enc, _ := scatter(0, slots, 2)
	before := r.dev.Stats()
	require.True(t, c.Encode(0, r.cold.Ptr(), codec.HostIndices(enc), s))
	require.NoError(t, s.Synchronize())
	after := r.dev.Stats()
	// The inner gather: one descriptor per page and pool; the DMA: one.
	assert.EqualValues(t, slots*pools+1, after.Descriptors-before.Descriptors)
	r.requireCold(enc)
}

// Bad calls fail synchronously and enqueue nothing: device indices, a
// negative index, a nil stream or cold base, an unknown lifecycle.
func TestStagedRejectsBadCallsAndEnqueuesNothing(t *testing.T) {
	r := newRig(t, emu.Options{})
	c := r.codec(codec.NewDefault(), staged.Options{})
	s := r.stream()
	good := codec.HostIndices([]codec.PageIndexPair{{Dst: 0, Src: 1}})
	before := r.dev.Stats()
	assert.False(t, c.Encode(0, r.cold.Ptr(), codec.DeviceIndices(r.cold.Ptr(), 1), s), "device indices")
	assert.False(t, c.Encode(0, r.cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: -1, Src: 0}}), s), "negative")
	assert.False(t, c.Decode(0, r.cold.Ptr(), good, nil), "nil stream")
	assert.False(t, c.Decode(0, 0, good, s), "nil cold base")
	assert.False(t, c.Encode(7, r.cold.Ptr(), good, s), "unknown lifecycle")
	assert.Equal(t, codec.BadLocation, c.QueryPageIndexLocation(7))
	assert.Equal(t, before.BatchCalls, r.dev.Stats().BatchCalls)
	assert.True(t, codec.IsMultiStream(c), "staging is per stream, the default codec is multi-stream")
	undeclared := r.codec(codectest.NewDeviceIndexed(r.dev), staged.Options{})
	assert.False(t, codec.IsMultiStream(undeclared), "as multi-stream as its inner codec")
	_, err := staged.New(r.dev, nil, staged.Options{})
	assert.Error(t, err)
	_, err = staged.New(r.dev, codec.NewDefault(), staged.Options{ChunkBytes: -1})
	assert.ErrorContains(t, err, "ChunkBytes")
}

// A chunk holds ChunkBytes of pages whatever the index batch cap, in one
// DMA for consecutive cold pages: a device-index inner codec gets it in calls of at most MaxIndexBatchPairs
// pairs (the design's kMaxIndexBatchBytes), and the bytes round-trip.
func TestStagedChunkBeyondTheIndexBatchCapReachesTheInnerCodecInCappedCalls(t *testing.T) {
	n := int64(staging.MaxIndexBatchPairs + staging.MaxIndexBatchPairs/2)
	r := newRigOf(t, emu.Options{}, n)
	inner := codectest.NewDeviceIndexed(r.dev)
	c := r.codec(inner, staged.Options{ChunkBytes: n * page})
	s := r.stream()
	enc, dec := scatter(0, int(n), 11)
	before := r.dev.Stats()
	require.True(t, c.Encode(0, r.cold.Ptr(), codec.HostIndices(enc), s))
	require.NoError(t, s.Synchronize())
	// Two inner calls (each its index upload, the inner codec's index copy
	// and gather) and one DMA: the chunk is not cut at the cap.
	assert.EqualValues(t, 2*3+1, r.dev.Stats().BatchCalls-before.BatchCalls)
	r.requireCold(enc)
	r.poison(s, dec)
	require.True(t, c.Decode(0, r.cold.Ptr(), codec.HostIndices(dec), s))
	require.NoError(t, s.Synchronize())
	r.requireHot(s)
	half := staging.MaxIndexBatchPairs / 2
	assert.Equal(t, []int{staging.MaxIndexBatchPairs, half, staging.MaxIndexBatchPairs, half}, inner.PairsPerCall())
}
