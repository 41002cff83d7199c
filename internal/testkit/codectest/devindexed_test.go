package codectest_test

import (
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

func pairBytes(pairs []codec.PageIndexPair) []byte {
	if len(pairs) == 0 {
		return nil
	}
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&pairs[0])), len(pairs)*codec.PageIndexPairBytes)...)
}

// upload enqueues an H2D copy of pairs into device memory on s without
// waiting, as the manager's device index ring does; the host staging is
// freed by t.Cleanup, after the test has synchronized.
func upload(t *testing.T, rig *codectest.Rig, s device.Stream, pairs []codec.PageIndexPair) device.Ptr {
	t.Helper()
	b := pairBytes(pairs)
	stage, err := rig.Alloc(device.HostMapped, int64(len(b)))
	require.NoError(t, err)
	copy(stage.Host(), b)
	idx, err := rig.Alloc(device.DeviceMemory, int64(len(b)))
	require.NoError(t, err)
	require.NoError(t, s.BatchCopy([]device.CopyDesc{{Dst: idx.Ptr(), Src: stage.Ptr(), Size: int64(len(b))}}))
	return idx.Ptr()
}

func TestDeviceIndexedQueries(t *testing.T) {
	dev, rig := newRig(t, emu.Options{})
	d := codectest.NewDeviceIndexed(dev)
	defer d.Close()
	require.True(t, d.Configure(rig.Groups))
	assert.False(t, d.Configure(rig.Groups))
	infos, err := codec.QueryAll(d, []layout.LayerGroupID{0, 1, 2, 3})
	require.NoError(t, err)
	for _, in := range infos {
		assert.Equal(t, codec.Device, in.Location)
		assert.Equal(t, in.LifeCycle, in.BatchingID)
	}
	assert.EqualValues(t, 264, infos[0].ColdPageBytes)
	assert.EqualValues(t, 256, infos[1].ColdPageBytes)
	assert.Equal(t, codec.BadLocation, d.QueryPageIndexLocation(4))
}

func TestDeviceIndexedRoundTripReadsIndicesInStreamOrder(t *testing.T) {
	dev, rig := newRig(t, emu.Options{Seed: 21, MaxDelay: 200 * time.Microsecond})
	rng := rand.New(rand.NewPCG(21, 21))
	const lc = 2
	orig := fill(t, rig, lc, randomBytes(rng))
	d := codectest.NewDeviceIndexed(dev)
	require.True(t, d.Configure(rig.Groups))
	cb := d.QueryColdPageBytes(lc)
	cold, err := rig.Alloc(device.DeviceMemory, 12*cb)
	require.NoError(t, err)

	// The index upload is enqueued, not finished, when Encode is called:
	// the codec may read the indices only through work on the stream.
	enc := []codec.PageIndexPair{{Dst: 11, Src: 0}, {Dst: 2, Src: 14}, {Dst: 6, Src: 6}, {Dst: 1, Src: 9}}
	encIdx := upload(t, rig, rig.Stream, enc)
	require.True(t, d.Encode(lc, cold.Ptr(), codec.DeviceIndices(encIdx, len(enc)), rig.Stream))
	require.NoError(t, rig.Stream.Synchronize())
	blob, err := rig.Read(cold.Ptr(), 12*cb)
	require.NoError(t, err)
	for _, p := range enc {
		require.Equal(t, orig[p.Src], blob[int64(p.Dst)*cb:int64(p.Dst+1)*cb], "cold page %d", p.Dst)
	}

	poison(t, rig, lc, 0xC3)
	dec := []codec.PageIndexPair{{Dst: 3, Src: 11}, {Dst: 4, Src: 2}, {Dst: 5, Src: 6}, {Dst: 15, Src: 1}}
	decIdx := upload(t, rig, rig.Stream, dec)
	require.True(t, d.Decode(lc, cold.Ptr(), codec.DeviceIndices(decIdx, len(dec)), rig.Stream))
	require.NoError(t, rig.Stream.Synchronize())
	for i, p := range dec {
		require.Equal(t, orig[enc[i].Src], readPage(t, rig, lc, p.Dst))
	}
	assert.Equal(t, []int{4, 4}, d.PairsPerCall())
	_, inFlight, orphans := d.ScratchStats()
	assert.Zero(t, inFlight)
	assert.Zero(t, orphans)
	require.NoError(t, d.Close())
}

func TestDeviceIndexedChunkedCallsThroughFaulty(t *testing.T) {
	// The manager splits a device-index batch into 64 KiB chunks: many calls
	// with the same representative, each counted by a Faulty wrapper.
	dev, rig := newRig(t, emu.Options{Seed: 22})
	rng := rand.New(rand.NewPCG(22, 22))
	orig := fill(t, rig, 1, randomBytes(rng))
	f := codectest.NewFaulty(codectest.NewDeviceIndexed(dev))
	require.True(t, f.Configure(rig.Groups))
	cb := f.QueryColdPageBytes(1)
	cold, err := rig.Alloc(device.HostMapped, 24*cb)
	require.NoError(t, err)
	for chunk := range 3 {
		var pairs []codec.PageIndexPair
		for k := range 8 {
			pairs = append(pairs, codec.PageIndexPair{Dst: int32(chunk*8 + k), Src: int32((chunk + k) % 8)})
		}
		require.True(t, f.Encode(1, cold.Ptr(), codec.DeviceIndices(upload(t, rig, rig.Stream, pairs), len(pairs)), rig.Stream))
	}
	require.NoError(t, rig.Stream.Synchronize())
	assert.Equal(t, []int{8, 8, 8}, f.PairsPerCall(codectest.OpEncode))
	assert.Equal(t, codec.Device, f.Calls()[0].Location)
	assert.Nil(t, f.Calls()[0].HostPairs)
	for chunk := range 3 {
		for k := range 8 {
			page := int64(chunk*8 + k)
			require.Equal(t, orig[(chunk+k)%8], cold.Host()[page*cb:(page+1)*cb])
		}
	}
	require.NoError(t, codec.Destroy(f))
}

func TestDeviceIndexedValidation(t *testing.T) {
	dev, rig := newRig(t, emu.Options{Seed: 23})
	d := codectest.NewDeviceIndexed(dev)
	defer d.Close()
	require.True(t, d.Configure(rig.Groups))
	cb := d.QueryColdPageBytes(0)
	cold, err := rig.Alloc(device.HostMapped, 4*cb)
	require.NoError(t, err)
	idx := upload(t, rig, rig.Stream, []codec.PageIndexPair{{Dst: 0, Src: 0}})
	require.NoError(t, rig.Stream.Synchronize())

	// What the host can see is checked synchronously, with nothing enqueued.
	for name, fn := range map[string]func() bool{
		"host indices":       func() bool { return d.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{}}), rig.Stream) },
		"null index pointer": func() bool { return d.Encode(0, cold.Ptr(), codec.DeviceIndices(0, 1), rig.Stream) },
		"unknown lifecycle":  func() bool { return d.Encode(9, cold.Ptr(), codec.DeviceIndices(idx, 1), rig.Stream) },
		"nil stream":         func() bool { return d.Decode(0, cold.Ptr(), codec.DeviceIndices(idx, 1), nil) },
		"null cold base":     func() bool { return d.Decode(0, 0, codec.DeviceIndices(idx, 1), rig.Stream) },
		"indices past their allocation": func() bool {
			return d.Encode(0, cold.Ptr(), codec.DeviceIndices(idx, 2), rig.Stream)
		},
	} {
		t.Run(name, func(t *testing.T) {
			before := dev.Stats()
			assert.False(t, fn())
			delta := statsDelta(before, dev.Stats())
			assert.Zero(t, delta.BatchCalls)
			assert.Zero(t, delta.HostFuncs)
			_, inFlight, _ := d.ScratchStats()
			assert.Zero(t, inFlight)
		})
	}
	assert.True(t, d.Encode(0, cold.Ptr(), codec.DeviceIndices(0, 0), rig.Stream), "an empty call is a no-op")

	// Index values live on the device: a bad one fails the stream
	// asynchronously and copies nothing.
	for i := range cold.Host() {
		cold.Host()[i] = 0x77
	}
	bad := upload(t, rig, rig.Stream, []codec.PageIndexPair{{Dst: 1, Src: 0}, {Dst: 2, Src: 16}})
	require.True(t, d.Encode(0, cold.Ptr(), codec.DeviceIndices(bad, 2), rig.Stream))
	err = rig.Stream.Synchronize()
	require.ErrorIs(t, err, codec.ErrBadIndex)
	assert.Contains(t, err.Error(), "hot slot 16")
	for i, b := range cold.Host() {
		require.EqualValues(t, 0x77, b, "byte %d untouched", i)
	}
	_, inFlight, _ := d.ScratchStats()
	assert.Zero(t, inFlight, "the scratch came back after the failure")
}
