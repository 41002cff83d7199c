package codectest_test

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// highBytes is the Half cold page of a hot page: every odd-offset byte.
func highBytes(page []byte) []byte {
	out := make([]byte, 0, len(page)/2)
	for i := 1; i < len(page); i += 2 {
		out = append(out, page[i])
	}
	return out
}

func TestHalfQueries(t *testing.T) {
	dev, rig := newRig(t, emu.Options{})
	h := codectest.NewHalf(dev)
	defer h.Close()
	require.True(t, h.Configure(rig.Groups))
	assert.False(t, h.Configure(rig.Groups), "configure exactly once")
	assert.EqualValues(t, (64+192+8)/2, h.QueryColdPageBytes(0))
	assert.EqualValues(t, 128, h.QueryColdPageBytes(3))
	assert.Equal(t, layout.LayerGroupID(2), h.GetBatchingLayerGroupID(2))
	assert.Equal(t, codec.Host, h.QueryPageIndexLocation(1))
	infos, err := codec.QueryAll(h, []layout.LayerGroupID{0, 1, 2, 3})
	require.NoError(t, err)
	assert.Len(t, infos, 4)
	_, err = codec.QueryAll(h, []layout.LayerGroupID{4})
	assert.ErrorIs(t, err, codec.ErrQuery)

	odd := codectest.NewHalf(dev)
	descs := []layout.PoolGroupDesc{{Index: 0, NumSlots: 4, LifeCycles: []layout.LayerGroupID{0}, Pools: []layout.PoolDesc{{Base: 0x1000, SlotBytes: 6}, {Base: 0x2000, SlotBytes: 7}}}}
	assert.False(t, odd.Configure(descs), "16-bit elements need even slot bytes")
}

func TestHalfRoundTripIsExactForZeroLowBytes(t *testing.T) {
	dev, rig := newRig(t, emu.Options{Seed: 9, MaxDelay: 100 * time.Microsecond})
	rng := rand.New(rand.NewPCG(3, 4))
	const lc = 0
	orig := fill(t, rig, lc, zeroLow(rng))

	h := codectest.NewHalf(dev)
	require.True(t, h.Configure(rig.Groups))
	cb := h.QueryColdPageBytes(lc)
	cold, err := rig.Alloc(device.DeviceMemory, 10*cb)
	require.NoError(t, err)
	live := dev.Stats().LiveAllocs

	enc := []codec.PageIndexPair{{Dst: 9, Src: 4}, {Dst: 0, Src: 13}, {Dst: 5, Src: 2}, {Dst: 3, Src: 7}}
	require.True(t, h.Encode(lc, cold.Ptr(), codec.HostIndices(enc), rig.Stream))
	require.NoError(t, rig.Stream.Synchronize())

	// Cold layout: the high bytes of the hot page, pools in order.
	blob, err := rig.Read(cold.Ptr(), 10*cb)
	require.NoError(t, err)
	for _, p := range enc {
		require.Equal(t, highBytes(orig[p.Src]), blob[int64(p.Dst)*cb:int64(p.Dst+1)*cb], "cold page %d", p.Dst)
	}

	poison(t, rig, lc, 0x5A)
	dec := []codec.PageIndexPair{{Dst: 1, Src: 9}, {Dst: 15, Src: 0}, {Dst: 8, Src: 5}, {Dst: 11, Src: 3}}
	require.True(t, h.Decode(lc, cold.Ptr(), codec.HostIndices(dec), rig.Stream))
	require.NoError(t, rig.Stream.Synchronize())
	for i, p := range dec {
		require.True(t, bytes.Equal(orig[enc[i].Src], readPage(t, rig, lc, p.Dst)), "slot %d is hot slot %d again", p.Dst, enc[i].Src)
	}
	assert.Equal(t, bytes.Repeat([]byte{0x5A}, int(rig.Group(lc).PageBytes())), readPage(t, rig, lc, 0), "other slots untouched")

	require.NoError(t, rig.Stream.Synchronize())
	assert.Greater(t, dev.Stats().LiveAllocs.HostMapped, live.HostMapped, "scratch is kept for reuse")
	require.NoError(t, h.Close())
	_, inFlight, orphans := h.ScratchStats()
	assert.Zero(t, inFlight)
	assert.Zero(t, orphans)
	assert.Equal(t, live, dev.Stats().LiveAllocs, "Close freed every scratch buffer")
}

func TestHalfLosesExactlyTheLowBytes(t *testing.T) {
	dev, rig := newRig(t, emu.Options{Seed: 10})
	rng := rand.New(rand.NewPCG(5, 6))
	orig := fill(t, rig, 3, randomBytes(rng))
	h := codectest.NewHalf(dev)
	require.True(t, h.Configure(rig.Groups))
	cb := h.QueryColdPageBytes(3)
	cold, err := rig.Alloc(device.HostMapped, 8*cb)
	require.NoError(t, err)

	require.True(t, h.Encode(3, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 2, Src: 6}}), rig.Stream))
	require.True(t, h.Decode(3, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 6, Src: 2}}), rig.Stream))
	require.NoError(t, rig.Stream.Synchronize())
	got := readPage(t, rig, 3, 6)
	want := bytes.Clone(orig[6])
	for i := 0; i < len(want); i += 2 {
		want[i] = 0 // the documented loss: low bytes come back zero
	}
	assert.Equal(t, want, got)
	assert.NotEqual(t, orig[6], got, "random data is not preserved")
	require.NoError(t, h.Close())
}

func TestHalfScratchIsNotReusedBeforeEarlierWorkFinished(t *testing.T) {
	// Many calls in flight on two streams with random delays: each must see
	// its own scratch.
	dev, rig := newRig(t, emu.Options{Seed: 11, MaxDelay: 300 * time.Microsecond})
	rng := rand.New(rand.NewPCG(7, 8))
	const lc = 2
	orig := fill(t, rig, lc, zeroLow(rng))
	s2, err := dev.NewStream()
	require.NoError(t, err)
	defer s2.Close()

	h := codectest.NewHalf(dev)
	require.True(t, h.Configure(rig.Groups))
	cb := h.QueryColdPageBytes(lc)
	cold, err := rig.Alloc(device.HostMapped, 64*cb)
	require.NoError(t, err)

	for call := range 32 {
		s := rig.Stream
		if call%2 == 1 {
			s = s2
		}
		// call k encodes slots k%16 and (k+5)%16 into cold pages 2k and 2k+1
		pairs := []codec.PageIndexPair{
			{Dst: int32(2 * call), Src: int32(call % 16)},
			{Dst: int32(2*call + 1), Src: int32((call + 5) % 16)},
		}
		require.True(t, h.Encode(lc, cold.Ptr(), codec.HostIndices(pairs), s))
	}
	_, inFlight, _ := h.ScratchStats()
	assert.Positive(t, inFlight, "calls are still in flight: nothing was synchronized")
	require.NoError(t, rig.Stream.Synchronize())
	require.NoError(t, s2.Synchronize())
	for call := range 32 {
		assert.Equal(t, highBytes(orig[call%16]), cold.Host()[int64(2*call)*cb:int64(2*call+1)*cb], "call %d page 0", call)
		assert.Equal(t, highBytes(orig[(call+5)%16]), cold.Host()[int64(2*call+1)*cb:int64(2*call+2)*cb], "call %d page 1", call)
	}
	_, inFlight, orphans := h.ScratchStats()
	assert.Zero(t, inFlight)
	assert.Zero(t, orphans)
	// The next call trims the idle buffers that host functions gave back.
	require.True(t, h.Encode(lc, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 0, Src: 0}}), rig.Stream))
	require.NoError(t, rig.Stream.Synchronize())
	idle, _, _ := h.ScratchStats()
	assert.LessOrEqual(t, idle, 4, "the idle pool is bounded")
	require.NoError(t, h.Close())
}

func TestHalfRejectsInvalidCallsWithNothingEnqueued(t *testing.T) {
	dev, rig := newRig(t, emu.Options{})
	h := codectest.NewHalf(dev)
	require.True(t, h.Configure(rig.Groups))
	cold, err := rig.Alloc(device.DeviceMemory, 4*h.QueryColdPageBytes(0))
	require.NoError(t, err)
	ok := codec.PageIndexPair{Dst: 0, Src: 0}
	for name, fn := range map[string]func() bool{
		"hot slot out of range": func() bool {
			return h.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{ok, {Dst: 1, Src: 16}}), rig.Stream)
		},
		"negative cold page": func() bool {
			return h.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{ok, {Dst: -1, Src: 1}}), rig.Stream)
		},
		"decode hot slot": func() bool {
			return h.Decode(1, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{ok, {Dst: 8, Src: 1}}), rig.Stream)
		},
		"cold page past the end": func() bool {
			return h.Decode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{ok, {Dst: 1, Src: 4}}), rig.Stream)
		},
		"unknown lifecycle": func() bool { return h.Encode(7, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{ok}), rig.Stream) },
		"device indices":    func() bool { return h.Encode(0, cold.Ptr(), codec.DeviceIndices(cold.Ptr(), 1), rig.Stream) },
		"nil stream":        func() bool { return h.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{ok}), nil) },
	} {
		t.Run(name, func(t *testing.T) {
			before := dev.Stats()
			assert.False(t, fn())
			d := statsDelta(before, dev.Stats())
			assert.Zero(t, d.BatchCalls)
			assert.Zero(t, d.HostFuncs)
			_, inFlight, orphans := h.ScratchStats()
			assert.Zero(t, inFlight, "scratch returned")
			assert.Zero(t, orphans)
		})
	}
	require.NoError(t, h.Close())
	assert.False(t, h.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{ok}), rig.Stream), "closed")
}

func TestHalfCloseWithWorkInFlightReportsTheLeak(t *testing.T) {
	dev, rig := newRig(t, emu.Options{Seed: 12, MaxDelay: 20 * time.Millisecond})
	h := codectest.NewHalf(dev)
	require.True(t, h.Configure(rig.Groups))
	cold, err := rig.Alloc(device.DeviceMemory, 4*h.QueryColdPageBytes(0))
	require.NoError(t, err)
	require.True(t, h.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 0, Src: 0}}), rig.Stream))
	err = h.Close()
	require.Error(t, err, "the owner must wait for the stream before destroying the codec")
	assert.Contains(t, err.Error(), "still used by enqueued work")
	require.NoError(t, rig.Stream.Synchronize(), "the leaked scratch stays valid for the work")
}
