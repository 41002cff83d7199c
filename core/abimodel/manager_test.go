package abimodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/layout"
)

// Close closes the caches still open, ACTIVE or SUSPENDED, running their
// OnClose; they are CLOSED for good and closing them again does nothing.
func TestCloseClosesOpenCaches(t *testing.T) {
	m := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	var closed []string
	a := active(t, m, s, CacheOptions{OnClose: func() { closed = append(closed, "a") }}, seq(0, 8))
	b := active(t, m, s, CacheOptions{OnClose: func() { closed = append(closed, "b") }}, seq(100, 8))
	require.NoError(t, b.Suspend())

	require.NoError(t, m.Close())
	assert.Equal(t, []string{"a", "b"}, closed, "in creation order, once each")
	assert.Equal(t, core.Closed, a.Core().Status())
	assert.Equal(t, core.Closed, b.Core().Status())
	assert.NoError(t, a.Close())
	assert.Equal(t, []string{"a", "b"}, closed, "a second close runs nothing")
	assert.NoError(t, m.Close(), "closing twice does nothing")
}

// After Close every call that needs the manager fails: object-model calls
// with ErrDestroyed, core queries with core.ErrClosed.
func TestCallsAfterCloseFail(t *testing.T) {
	m := newManager(t, Options{})
	require.NoError(t, m.Close())
	_, err := m.CreateCache(CacheOptions{})
	assert.ErrorIs(t, err, ErrDestroyed)
	_, err = m.CreateStream()
	assert.ErrorIs(t, err, ErrDestroyed)
	_, err = m.AllocMemory(device.HostMapped, 64)
	assert.ErrorIs(t, err, ErrDestroyed)
	assert.ErrorIs(t, m.AttachCP(NewNullIndex()), ErrDestroyed)
	_, err = m.NewManagerBackedIndex(cpOpts())
	assert.ErrorIs(t, err, ErrDestroyed)
	_, err = m.Core().Quota(layout.GPULevel)
	assert.ErrorIs(t, err, core.ErrClosed)
}

// Close frees the streams and memory the manager allocated, and takes its
// device out of the registry.
func TestCloseReleasesStreamsMemoryAndRegistration(t *testing.T) {
	reg := &DeviceRegistry{}
	m := newManager(t, Options{Registry: reg})
	s, err := m.CreateStream()
	require.NoError(t, err)
	_, err = m.AllocMemory(device.DeviceMemory, 256)
	require.NoError(t, err)
	_, err = reg.Alloc(s.Handle(), device.HostMapped, 256)
	require.NoError(t, err)
	_, err = reg.Stream(s.Handle())
	require.NoError(t, err, "the manager's device is registered")

	require.NoError(t, m.Close())
	_, err = reg.Stream(s.Handle())
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "the device is gone from the registry")
	assert.ErrorIs(t, s.Synchronize(), device.ErrClosed, "the stream was destroyed")
}

// AllocMemory checks its size and FreeMemory frees only what AllocMemory
// returned, once.
func TestManagerMemory(t *testing.T) {
	m := newManager(t, Options{})
	for _, size := range []uint64{0, MaxElems + 1} {
		_, err := m.AllocMemory(device.HostMapped, size)
		assert.ErrorIs(t, err, core.ErrInvalidArgument, "size %d", size)
	}
	_, err := m.AllocMemory(device.MemoryKind(7), 64)
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "unknown kind")
	p, err := m.AllocMemory(device.HostMapped, 64)
	require.NoError(t, err)
	require.NoError(t, m.FreeMemory(p))
	assert.ErrorIs(t, m.FreeMemory(p), core.ErrInvalidArgument, "freed twice")
}

// New consumes the codec also when it fails, before or after opening the
// device.
func TestNewConsumesTheCodecOnFailure(t *testing.T) {
	for name, opts := range map[string]Options{
		"bad device":   {Device: "tpu"},
		"bad ordinal":  {Device: backend.Emu, DeviceOrdinal: -1},
		"bad capacity": {Device: backend.Emu, EventQueueCapacity: -1},
	} {
		owned := codec.CreateDefaultColdPageCodec()
		opts.Codec = owned
		_, err := New(smallConfig(16), opts)
		assert.ErrorIs(t, err, core.ErrInvalidArgument, name)
		assert.True(t, owned.Consumed(), name)
	}
	owned := codec.CreateDefaultColdPageCodec()
	bad := smallConfig(16)
	bad.TokensPerBlock = 0
	_, err := New(bad, Options{Device: backend.Emu, Codec: owned, Registry: &DeviceRegistry{}})
	assert.ErrorIs(t, err, core.ErrInvalidConfig)
	assert.True(t, owned.Consumed(), "bad config")
}

// A built-in codec is made on the device New opens: the kernel-only ones are
// refused on the emulated device (ErrCodecRejected wrapping ErrNeedsCUDA),
// Auto is made there and runs as the default codec.
func TestNewMakesTheBuiltinCodecOnItsDevice(t *testing.T) {
	reg := &DeviceRegistry{}
	for _, k := range []gpucodec.Kind{gpucodec.KindGather, gpucodec.KindFP8} {
		_, err := New(smallConfig(16), Options{Device: backend.Emu, Builtin: &gpucodec.Spec{Kind: k}, Registry: reg})
		assert.ErrorIs(t, err, core.ErrCodecRejected, "%v", k)
		assert.ErrorIs(t, err, gpucodec.ErrNeedsCUDA, "%v", k)
	}
	m, err := New(smallConfig(16), Options{Device: backend.Emu, Builtin: &gpucodec.Spec{Kind: gpucodec.KindAuto}, Registry: reg})
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// Validate reports the argument or field at fault and allocates nothing.
func TestValidate(t *testing.T) {
	assert.NoError(t, Validate(smallConfig(16), Options{}))
	assert.ErrorContains(t, Validate(smallConfig(16), Options{Device: "tpu"}), "config.device")
	assert.ErrorContains(t, Validate(smallConfig(16), Options{DeviceOrdinal: -1}), "config.device_ordinal")
	bad := smallConfig(16)
	bad.Layers[1].Buffers[0].Size = 0
	assert.ErrorIs(t, Validate(bad, Options{}), core.ErrInvalidConfig)
}

// Listeners added after construction see every event: adding one fails
// once the manager has emitted an event.
func TestListenBeforeTheFirstEvent(t *testing.T) {
	m := newManager(t, Options{})
	var seen int
	remove, err := m.Listen(func(core.CacheEvent) { seen++ })
	require.NoError(t, err)
	s, err := m.CreateStream()
	require.NoError(t, err)
	c := active(t, m, s, CacheOptions{}, seq(0, 8))
	assert.Equal(t, 2, seen)
	_, err = m.Listen(func(core.CacheEvent) {})
	assert.ErrorIs(t, err, core.ErrInvalidState)
	remove()
	require.NoError(t, c.Close())
	active(t, m, s, CacheOptions{}, seq(200, 4))
	assert.Equal(t, 2, seen, "a removed listener sees nothing")
}

// The queries the C ABI adds fail with core.ErrClosed once the manager is
// closed; cold levels are described with one pool per group and no base.
func TestQueries(t *testing.T) {
	m := newManager(t, Options{})
	hot, err := m.PoolGroupDescs(layout.GPULevel)
	require.NoError(t, err)
	require.Len(t, hot, 1)
	assert.NotZero(t, hot[0].Pools[0].Base)
	cold, err := m.PoolGroupDescs(layout.CacheLevel(1))
	require.NoError(t, err)
	require.Len(t, cold, 1)
	assert.Equal(t, []layout.PoolDesc{{SlotBytes: 256}}, cold[0].Pools)
	_, err = m.PoolGroupDescs(layout.CacheLevel(5))
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	n, err := m.ProbeReuse(blockhash.Scope{}, seq(0, 8))
	require.NoError(t, err)
	assert.Zero(t, n)
	ms, err := m.MigrationStats()
	require.NoError(t, err)
	require.Len(t, ms, len(core.Paths()))
	for i, p := range core.Paths() {
		assert.Equal(t, p, ms[i].Path, "one entry per path, in path order")
	}

	require.NoError(t, m.Close())
	_, err = m.PoolGroupDescs(layout.GPULevel)
	assert.ErrorIs(t, err, core.ErrClosed)
	_, err = m.ProbeReuse(blockhash.Scope{}, seq(0, 8))
	assert.ErrorIs(t, err, core.ErrClosed)
	_, err = m.MigrationStats()
	assert.ErrorIs(t, err, core.ErrClosed)
	_, _, err = m.ProbeFirstNewBlockKey(blockhash.Scope{}, seq(0, 8))
	assert.ErrorIs(t, err, core.ErrClosed)
	_, err = m.ProbeReuseDigests(blockhash.Scope{}, seq(0, 8), nil, "")
	assert.ErrorIs(t, err, core.ErrClosed)
}

// The probes with digest tokens check the digests before anything else:
// digest bytes that do not match the positions are an invalid argument
// naming digest_positions. Without digests they answer as the plain probes.
func TestProbesWithDigests(t *testing.T) {
	m := newManager(t, Options{})
	_, _, err := m.ProbeFirstNewBlockKeyDigests(blockhash.Scope{}, seq(0, 8), []uint64{1}, "short")
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "digest_positions")
	_, err = m.ProbeReuseDigests(blockhash.Scope{}, seq(0, 8), []uint64{1}, "")
	assert.ErrorIs(t, err, core.ErrInvalidArgument)

	k, ok, err := m.ProbeFirstNewBlockKey(blockhash.Scope{}, seq(0, 8))
	require.NoError(t, err)
	wantK, wantOK := m.Core().ProbeFirstNewBlockKey(blockhash.Scope{}, seq(0, 8))
	assert.Equal(t, wantK, k)
	assert.Equal(t, wantOK, ok)
	assert.True(t, ok, "nothing is cached: the first block is new")
	n, err := m.ProbeReuseDigests(blockhash.Scope{}, seq(0, 8), nil, "")
	require.NoError(t, err)
	assert.Zero(t, n)
}

// AggregatedPages names each run's buffers by their positions in the
// request (the first one of a key asked for twice), and every buffer asked
// for lands in exactly one run.
func TestAggregatedPagesNameBuffersByPosition(t *testing.T) {
	m := newManager(t, Options{})
	keys := []layout.BufferKey{{Layer: 1, Role: config.RoleValue}, {Layer: 0, Role: config.RoleKey}, {Layer: 1, Role: config.RoleKey}}
	runs, err := m.AggregatedPages(keys)
	require.NoError(t, err)
	want, err := m.Core().AggregatedPages(keys)
	require.NoError(t, err)
	require.Len(t, runs, len(want))
	seen := map[int]bool{}
	for i, r := range runs {
		assert.Equal(t, want[i].Base, r.Base)
		assert.Equal(t, want[i].Size, r.Size)
		require.Len(t, r.Buffers, len(want[i].Buffers))
		for j, b := range r.Buffers {
			assert.Equal(t, want[i].Buffers[j].Buffer, keys[b.Buffer], "run %d buffer %d is named by its position", i, j)
			assert.Equal(t, want[i].Buffers[j].Expansion, b.Expansion)
			assert.False(t, seen[b.Buffer], "buffer %d lands in one run", b.Buffer)
			seen[b.Buffer] = true
		}
	}
	assert.Len(t, seen, len(keys))
	_, err = m.AggregatedPages([]layout.BufferKey{{Layer: 9, Role: config.RoleKey}})
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}

// Peak statistics are reset only by a call whose buffer holds every group:
// a size query or a buffer too small resets nothing.
func TestPeakStatsResetOnlyWhenTheyFit(t *testing.T) {
	m := newManager(t, Options{})
	s, err := m.CreateStream()
	require.NoError(t, err)
	c := active(t, m, s, CacheOptions{}, seq(0, 8))
	require.NoError(t, c.Resize(16, -1)) // 4 pages, 2 of them private
	require.NoError(t, c.Close())        // 2 stay cached
	peaks, n, err := m.GetAndResetIterationPeakBlockStats(layout.GPULevel, 0)
	require.NoError(t, err)
	assert.Nil(t, peaks)
	assert.Equal(t, 1, n)
	peaks, n, err = m.GetAndResetIterationPeakBlockStats(layout.GPULevel, 4)
	require.NoError(t, err)
	require.Len(t, peaks, 1)
	assert.Equal(t, 1, n)
	assert.Equal(t, int64(4), peaks[0].PeakUsed, "the size query reset nothing")
	peaks, _, err = m.GetAndResetIterationPeakBlockStats(layout.GPULevel, 1)
	require.NoError(t, err)
	assert.Equal(t, int64(2), peaks[0].PeakUsed, "reset by the previous call")
}
