package codectest_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

func TestFaultyPassesThroughAndCountsCalls(t *testing.T) {
	dev, rig := newRig(t, emu.Options{Seed: 1})
	rng := rand.New(rand.NewPCG(1, 1))
	orig := fill(t, rig, 1, randomBytes(rng))
	f := codectest.NewFaulty(codec.NewDefault())
	require.True(t, f.Configure(rig.Groups))
	assert.Equal(t, 1, f.ConfigureCalls())
	assert.Equal(t, rig.Groups, f.ConfiguredWith())
	cb := f.QueryColdPageBytes(1)
	assert.EqualValues(t, 256, cb)
	cold, err := rig.Alloc(device.HostMapped, 8*cb)
	require.NoError(t, err)

	pairs := []codec.PageIndexPair{{Dst: 1, Src: 2}, {Dst: 0, Src: 7}, {Dst: 5, Src: 3}}
	before := dev.Stats()
	require.True(t, f.Encode(1, cold.Ptr(), codec.HostIndices(pairs), rig.Stream))
	require.True(t, f.Encode(1, cold.Ptr(), codec.HostIndices(pairs[:1]), rig.Stream))
	require.True(t, f.Decode(1, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 4, Src: 5}}), rig.Stream))
	assert.EqualValues(t, 3, statsDelta(before, dev.Stats()).BatchCalls, "one batch per codec call")
	require.NoError(t, rig.Stream.Synchronize())
	assert.Equal(t, orig[3], readPage(t, rig, 1, 4))

	assert.Equal(t, 2, f.CallCount(codectest.OpEncode))
	assert.Equal(t, 1, f.CallCount(codectest.OpDecode))
	assert.Equal(t, []int{3, 1}, f.PairsPerCall(codectest.OpEncode))
	assert.Equal(t, []int{1}, f.PairsPerCall(codectest.OpDecode))
	calls := f.Calls()
	require.Len(t, calls, 3)
	assert.Equal(t, codectest.Call{Op: codectest.OpEncode, LifeCycle: 1, Location: codec.Host, Pairs: 3, HostPairs: pairs, OK: true}, calls[0])
	pairs[0].Dst = 99
	assert.EqualValues(t, 1, f.Calls()[0].HostPairs[0].Dst, "recorded pairs are a copy")
	f.ResetCalls()
	assert.Empty(t, f.Calls())
}

func TestFaultyRejectsConfigureWithoutConfiguringTheInnerCodec(t *testing.T) {
	inner := codec.NewDefault()
	f := codectest.NewFaulty(inner)
	f.RejectConfigure(true)
	descs := []layout.PoolGroupDesc{{Index: 0, NumSlots: 2, LifeCycles: []layout.LayerGroupID{0}, Pools: []layout.PoolDesc{{Base: 0x1000, SlotBytes: 8}}}}
	assert.False(t, f.Configure(descs))
	assert.Equal(t, 1, f.ConfigureCalls())
	assert.Zero(t, inner.QueryColdPageBytes(0), "the inner codec was not configured")
}

func TestFaultyOverridesQueries(t *testing.T) {
	f := codectest.NewFaulty(codec.NewDefault())
	require.True(t, f.Configure([]layout.PoolGroupDesc{
		{Index: 0, NumSlots: 2, LifeCycles: []layout.LayerGroupID{0, 1}, Pools: []layout.PoolDesc{{Base: 0x1000, SlotBytes: 8}}},
	}))
	f.SetColdPageBytes(0, 0)
	f.SetBatchingID(1, -3)
	f.SetLocation(1, codec.BadLocation)
	assert.Zero(t, f.QueryColdPageBytes(0))
	assert.EqualValues(t, 8, f.QueryColdPageBytes(1))
	assert.EqualValues(t, -3, f.GetBatchingLayerGroupID(1))
	assert.EqualValues(t, 0, f.GetBatchingLayerGroupID(0))
	assert.Equal(t, codec.BadLocation, f.QueryPageIndexLocation(1))

	_, err := codec.QueryAll(f, []layout.LayerGroupID{0, 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lifecycle 0: QueryColdPageBytes")
	assert.Contains(t, err.Error(), "lifecycle 1: GetBatchingLayerGroupID returned -3")
	assert.Contains(t, err.Error(), "lifecycle 1: QueryPageIndexLocation")

	f.ClearOverrides()
	_, err = codec.QueryAll(f, []layout.LayerGroupID{0, 1})
	assert.NoError(t, err)

	// Non-failure values too, to build inconsistent classes.
	f.SetBatchingID(1, 0)
	f.SetLocation(0, codec.Device)
	assert.EqualValues(t, 0, f.GetBatchingLayerGroupID(1))
	assert.Equal(t, codec.Device, f.QueryPageIndexLocation(0))
}

func TestFaultySynchronousFailureEnqueuesNothing(t *testing.T) {
	dev, rig := newRig(t, emu.Options{})
	f := codectest.NewFaulty(codec.NewDefault())
	require.True(t, f.Configure(rig.Groups))
	cold, err := rig.Alloc(device.DeviceMemory, 8*f.QueryColdPageBytes(0))
	require.NoError(t, err)
	idx := codec.HostIndices([]codec.PageIndexPair{{Dst: 0, Src: 0}})

	f.FailSync(codectest.OpEncode, 1, 2) // pass one, fail two, then pass
	var results []bool
	for range 4 {
		before := dev.Stats()
		ok := f.Encode(0, cold.Ptr(), idx, rig.Stream)
		results = append(results, ok)
		if !ok {
			assert.Zero(t, statsDelta(before, dev.Stats()).BatchCalls, "nothing enqueued")
		}
	}
	assert.Equal(t, []bool{true, false, false, true}, results)
	assert.True(t, f.Decode(0, cold.Ptr(), idx, rig.Stream), "decode is not affected")
	calls := f.Calls()
	assert.Equal(t, codectest.SyncFault, calls[1].Injected)
	assert.False(t, calls[1].OK)

	f.FailSync(codectest.OpDecode, 0, -1)
	for range 3 {
		assert.False(t, f.Decode(0, cold.Ptr(), idx, rig.Stream))
	}
	f.Heal()
	assert.True(t, f.Decode(0, cold.Ptr(), idx, rig.Stream))
	require.NoError(t, rig.Stream.Synchronize())
}

func TestFaultyAsynchronousFailureRunsTheWorkThenFailsTheStream(t *testing.T) {
	dev, rig := newRig(t, emu.Options{Seed: 2})
	rng := rand.New(rand.NewPCG(2, 2))
	orig := fill(t, rig, 0, randomBytes(rng))
	f := codectest.NewFaulty(codec.NewDefault())
	require.True(t, f.Configure(rig.Groups))
	cb := f.QueryColdPageBytes(0)
	cold, err := rig.Alloc(device.HostMapped, 8*cb)
	require.NoError(t, err)
	ev, err := dev.NewEvent()
	require.NoError(t, err)
	defer ev.Close()

	f.FailAsync(codectest.OpEncode, 0, 1, nil)
	require.NoError(t, rig.Stream.Record(ev)) // start a clean interval
	assert.True(t, f.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 3, Src: 5}}), rig.Stream),
		"an asynchronous failure is not a submission failure")
	require.NoError(t, rig.Stream.Record(ev))
	err = ev.Synchronize()
	require.ErrorIs(t, err, device.ErrInjected, "the event recorded after the call carries the failure")
	assert.Equal(t, orig[5], cold.Host()[3*cb:4*cb], "the real work ran before the injected failure")

	// The next call is clean again, and a custom error is carried as given.
	assert.True(t, f.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 4, Src: 6}}), rig.Stream))
	require.NoError(t, rig.Stream.Record(ev))
	require.NoError(t, ev.Synchronize())

	boom := errors.New("boom")
	f.FailAsync(codectest.OpDecode, 0, -1, boom)
	assert.True(t, f.Decode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 1, Src: 3}}), rig.Stream))
	assert.ErrorIs(t, rig.Stream.Synchronize(), boom)
	assert.Equal(t, codectest.AsyncFault, f.Calls()[2].Injected)
}

func TestFaultyClosesItsInnerCodecOnce(t *testing.T) {
	inner := codectest.NewFaulty(codec.NewDefault())
	f := codectest.NewFaulty(inner)
	require.NoError(t, f.Close())
	require.NoError(t, f.Close())
	assert.Equal(t, 2, f.Closes(), "both calls are counted so tests can catch a double close")
	assert.Equal(t, 1, inner.Closes(), "the inner codec is destroyed once")
}

// A panic fault panics with an *InjectedPanic, enqueues nothing, and counts
// like the other faults (skip, then count calls).
func TestFaultyPanicFaultPanicsWithInjectedPanicEnqueuingNothing(t *testing.T) {
	dev, rig := newRig(t, emu.Options{})
	f := codectest.NewFaulty(codec.NewDefault())
	require.True(t, f.Configure(rig.Groups))
	cold, err := rig.Alloc(device.DeviceMemory, 8*f.QueryColdPageBytes(0))
	require.NoError(t, err)
	idx := codec.HostIndices([]codec.PageIndexPair{{Dst: 0, Src: 0}})

	f.FailPanic(codectest.OpDecode, 1, 1)
	assert.True(t, f.Decode(0, cold.Ptr(), idx, rig.Stream))
	before := dev.Stats()
	func() {
		defer func() {
			r := recover()
			var ip *codectest.InjectedPanic
			require.True(t, errors.As(r.(error), &ip), "panics with %v", r)
			assert.Equal(t, codectest.OpDecode, ip.Op)
		}()
		f.Decode(0, cold.Ptr(), idx, rig.Stream)
	}()
	assert.Zero(t, statsDelta(before, dev.Stats()).BatchCalls, "nothing enqueued")
	assert.True(t, f.Decode(0, cold.Ptr(), idx, rig.Stream), "the fault is spent")
	assert.Equal(t, codectest.PanicFault, f.Calls()[1].Injected)
	require.NoError(t, rig.Stream.Synchronize())
}
