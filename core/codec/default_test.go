package codec_test

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

// Two hot groups: lifecycles 0 and 2 share a three-pool group, lifecycle 1
// has a one-pool group of its own.
var rigSpecs = []codectest.GroupSpec{
	{NumSlots: 16, LifeCycles: lcs(0, 2), SlotBytes: []int64{64, 192, 8}},
	{NumSlots: 8, LifeCycles: lcs(1), SlotBytes: []int64{256}},
}

func newRig(t *testing.T, opts emu.Options, kind device.MemoryKind) (*emu.Device, *codectest.Rig) {
	t.Helper()
	dev := emu.New(opts)
	rig, err := codectest.NewRig(dev, kind, rigSpecs...)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, rig.Close())
		assert.NoError(t, dev.Close())
	})
	return dev, rig
}

func fillRandom(t *testing.T, rig *codectest.Rig, lc layout.LayerGroupID, rng *rand.Rand) [][]byte {
	t.Helper()
	g := rig.Group(lc)
	pages := make([][]byte, g.NumSlots)
	for s := range pages {
		pages[s] = make([]byte, g.PageBytes())
		for i := range pages[s] {
			pages[s][i] = byte(rng.Uint32())
		}
		require.NoError(t, rig.WritePage(lc, int64(s), pages[s]))
	}
	return pages
}

func delta(before, after emu.Stats) emu.Stats {
	return emu.Stats{
		BatchCalls:   after.BatchCalls - before.BatchCalls,
		Descriptors:  after.Descriptors - before.Descriptors,
		RegionSplits: after.RegionSplits - before.RegionSplits,
		HostFuncs:    after.HostFuncs - before.HostFuncs,
	}
}

// scattered, non-contiguous, unordered pages
var encodePairs = []codec.PageIndexPair{
	{Dst: 7, Src: 3}, {Dst: 0, Src: 15}, {Dst: 4, Src: 9}, {Dst: 11, Src: 1}, {Dst: 2, Src: 6},
}

func TestDefaultCodecRoundTripIsByteExact(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts emu.Options
		kind device.MemoryKind
	}{
		{"device memory", emu.Options{Seed: 1}, device.DeviceMemory},
		{"device memory with delays", emu.Options{Seed: 2, MaxDelay: 200 * time.Microsecond}, device.DeviceMemory},
		{"mapped host memory", emu.Options{Seed: 3}, device.HostMapped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, rig := newRig(t, tc.opts, tc.kind)
			rng := rand.New(rand.NewPCG(42, 7))
			const lc = 2
			orig := fillRandom(t, rig, lc, rng)
			fillRandom(t, rig, 1, rng) // the other group must stay untouched

			c := codec.NewDefault()
			require.True(t, c.Configure(rig.Groups))
			coldBytes := c.QueryColdPageBytes(lc)
			require.EqualValues(t, 64+192+8, coldBytes)
			pools := int64(len(rig.Group(lc).Pools))

			const coldPages = 12
			cold, err := rig.Alloc(device.HostMapped, coldPages*coldBytes)
			require.NoError(t, err)
			blob := cold.Host()
			for i := range blob {
				blob[i] = 0xEE
			}

			// Encode: one batch call, one descriptor per page and pool.
			before := dev.Stats()
			require.True(t, c.Encode(lc, cold.Ptr(), codec.HostIndices(encodePairs), rig.Stream))
			d := delta(before, dev.Stats())
			assert.EqualValues(t, 1, d.BatchCalls, "exactly one BatchCopy per codec call")
			assert.EqualValues(t, int64(len(encodePairs))*pools, d.Descriptors)
			assert.Zero(t, d.HostFuncs)
			require.NoError(t, rig.Stream.Synchronize())

			// The blob layout, byte by byte: cold page Dst is the
			// concatenation of hot slot Src in pool order.
			written := map[int32]bool{}
			for _, p := range encodePairs {
				written[p.Dst] = true
				got := blob[int64(p.Dst)*coldBytes : int64(p.Dst+1)*coldBytes]
				require.True(t, bytes.Equal(orig[p.Src], got), "cold page %d holds hot slot %d", p.Dst, p.Src)
			}
			for cp := int32(0); cp < coldPages; cp++ {
				if !written[cp] {
					require.Equal(t, bytes.Repeat([]byte{0xEE}, int(coldBytes)), blob[int64(cp)*coldBytes:int64(cp+1)*coldBytes], "cold page %d untouched", cp)
				}
			}

			// Poison the hot group, then decode each cold page into a
			// different slot than it came from.
			g := rig.Group(lc)
			for s := range g.NumSlots {
				require.NoError(t, rig.WritePage(lc, s, bytes.Repeat([]byte{0xAA}, int(g.PageBytes()))))
			}
			decodePairs := make([]codec.PageIndexPair, len(encodePairs))
			for i, p := range encodePairs {
				decodePairs[i] = codec.PageIndexPair{Dst: (p.Src + 5) % int32(g.NumSlots), Src: p.Dst}
			}
			before = dev.Stats()
			require.True(t, c.Decode(lc, cold.Ptr(), codec.HostIndices(decodePairs), rig.Stream))
			d = delta(before, dev.Stats())
			assert.EqualValues(t, 1, d.BatchCalls)
			assert.EqualValues(t, int64(len(decodePairs))*pools, d.Descriptors)
			require.NoError(t, rig.Stream.Synchronize())

			restored := map[int64]bool{}
			for i, p := range decodePairs {
				restored[int64(p.Dst)] = true
				got, err := rig.ReadPage(lc, int64(p.Dst))
				require.NoError(t, err)
				require.True(t, bytes.Equal(orig[encodePairs[i].Src], got), "slot %d restored from hot slot %d", p.Dst, encodePairs[i].Src)
			}
			for s := range g.NumSlots {
				if !restored[s] {
					got, err := rig.ReadPage(lc, s)
					require.NoError(t, err)
					require.Equal(t, bytes.Repeat([]byte{0xAA}, int(g.PageBytes())), got, "slot %d untouched", s)
				}
			}
			require.NoError(t, codec.Destroy(c))
		})
	}
}

func TestDefaultCodecSubmitsOneBatchEvenAcrossHostRegions(t *testing.T) {
	// Region splitting is the device backend's job: with host memory
	// registered in small regions the codec still makes one BatchCopy of
	// pages*pools descriptors, and the backend splits them.
	dev, rig := newRig(t, emu.Options{Seed: 4, HostRegionBytes: 100}, device.HostMapped)
	rng := rand.New(rand.NewPCG(1, 2))
	orig := fillRandom(t, rig, 0, rng)
	c := codec.NewDefault()
	require.True(t, c.Configure(rig.Groups))
	cb := c.QueryColdPageBytes(0)
	cold, err := rig.Alloc(device.HostMapped, 16*cb)
	require.NoError(t, err)

	pairs := []codec.PageIndexPair{{Dst: 3, Src: 12}, {Dst: 1, Src: 0}, {Dst: 9, Src: 5}}
	before := dev.Stats()
	require.True(t, c.Encode(0, cold.Ptr(), codec.HostIndices(pairs), rig.Stream))
	d := delta(before, dev.Stats())
	assert.EqualValues(t, 1, d.BatchCalls)
	assert.Positive(t, d.RegionSplits)
	assert.EqualValues(t, 3*3, d.Descriptors-d.RegionSplits, "the codec's own descriptors")
	require.NoError(t, rig.Stream.Synchronize())
	for _, p := range pairs {
		assert.Equal(t, orig[p.Src], cold.Host()[int64(p.Dst)*cb:int64(p.Dst+1)*cb])
	}
}

func TestDefaultCodecLargeBatchIsNeverChunked(t *testing.T) {
	dev := emu.New(emu.Options{})
	defer dev.Close()
	rig, err := codectest.NewRig(dev, device.DeviceMemory, codectest.GroupSpec{NumSlots: 20000, LifeCycles: lcs(0), SlotBytes: []int64{2, 6}})
	require.NoError(t, err)
	defer rig.Close()
	c := codec.NewDefault()
	require.True(t, c.Configure(rig.Groups))
	cold, err := rig.Alloc(device.DeviceMemory, 20000*8)
	require.NoError(t, err)
	pairs := make([]codec.PageIndexPair, 20000) // 160 KB of indices, well past any 64 KiB cap
	for i := range pairs {
		pairs[i] = codec.PageIndexPair{Dst: int32(19999 - i), Src: int32(i)}
	}
	before := dev.Stats()
	require.True(t, c.Encode(0, cold.Ptr(), codec.HostIndices(pairs), rig.Stream))
	d := delta(before, dev.Stats())
	assert.EqualValues(t, 1, d.BatchCalls)
	assert.EqualValues(t, 40000, d.Descriptors)
	require.NoError(t, rig.Stream.Synchronize())
}

func TestDefaultCodecRejectsInvalidCallsSynchronouslyWithNothingEnqueued(t *testing.T) {
	dev, rig := newRig(t, emu.Options{Seed: 5}, device.DeviceMemory)
	c := codec.NewDefault()
	unconfigured := codec.NewDefault()
	require.True(t, c.Configure(rig.Groups))
	cold, err := rig.Alloc(device.HostMapped, 16*c.QueryColdPageBytes(0))
	require.NoError(t, err)
	good := codec.PageIndexPair{Dst: 0, Src: 0}
	many := func(bad codec.PageIndexPair) []codec.PageIndexPair {
		// valid pairs first: a late bad pair must not leave a partial submission
		out := []codec.PageIndexPair{good, {Dst: 1, Src: 1}, {Dst: 2, Src: 2}}
		return append(out, bad)
	}

	type call func() bool
	enc := func(c codec.ColdPageCodec, lg layout.LayerGroupID, base device.Ptr, idx codec.PageIndices, s device.Stream) call {
		return func() bool { return c.Encode(lg, base, idx, s) }
	}
	dec := func(c codec.ColdPageCodec, lg layout.LayerGroupID, base device.Ptr, idx codec.PageIndices, s device.Stream) call {
		return func() bool { return c.Decode(lg, base, idx, s) }
	}
	s, base := rig.Stream, cold.Ptr()
	cases := map[string]call{
		"encode hot slot = NumSlots":    enc(c, 0, base, codec.HostIndices(many(codec.PageIndexPair{Dst: 3, Src: 16})), s),
		"encode negative hot slot":      enc(c, 0, base, codec.HostIndices(many(codec.PageIndexPair{Dst: 3, Src: -1})), s),
		"encode negative cold page":     enc(c, 0, base, codec.HostIndices(many(codec.PageIndexPair{Dst: -1, Src: 3})), s),
		"decode hot slot = NumSlots":    dec(c, 0, base, codec.HostIndices(many(codec.PageIndexPair{Dst: 16, Src: 3})), s),
		"decode negative hot slot":      dec(c, 0, base, codec.HostIndices(many(codec.PageIndexPair{Dst: -2, Src: 3})), s),
		"decode negative cold page":     dec(c, 0, base, codec.HostIndices(many(codec.PageIndexPair{Dst: 3, Src: -7})), s),
		"other group's slot range":      enc(c, 1, base, codec.HostIndices(many(codec.PageIndexPair{Dst: 3, Src: 8})), s),
		"unknown lifecycle":             enc(c, 5, base, codec.HostIndices([]codec.PageIndexPair{good}), s),
		"device indices":                enc(c, 0, base, codec.DeviceIndices(cold.Ptr(), 1), s),
		"nil stream":                    enc(c, 0, base, codec.HostIndices([]codec.PageIndexPair{good}), nil),
		"null cold base":                dec(c, 0, 0, codec.HostIndices([]codec.PageIndexPair{good}), s),
		"unconfigured codec":            enc(unconfigured, 0, base, codec.HostIndices([]codec.PageIndexPair{good}), s),
		"cold page past the allocation": enc(c, 0, base, codec.HostIndices(many(codec.PageIndexPair{Dst: 16, Src: 3})), s),
	}
	for name, fn := range cases {
		t.Run(name, func(t *testing.T) {
			before := dev.Stats()
			assert.False(t, fn())
			after := dev.Stats()
			assert.Equal(t, before.BatchCalls, after.BatchCalls, "no BatchCopy accepted")
			assert.Equal(t, before.Descriptors, after.Descriptors)
			assert.Equal(t, before.HostFuncs, after.HostFuncs)
			require.NoError(t, rig.Stream.Synchronize(), "and no asynchronous failure either")
		})
	}
	// The codec is still usable after rejections.
	assert.True(t, c.Encode(0, base, codec.HostIndices(many(codec.PageIndexPair{Dst: 15, Src: 15})), s))
	require.NoError(t, rig.Stream.Synchronize())
}

func TestDefaultCodecEmptyCallIsANoOp(t *testing.T) {
	dev, rig := newRig(t, emu.Options{}, device.DeviceMemory)
	c := codec.NewDefault()
	require.True(t, c.Configure(rig.Groups))
	before := dev.Stats()
	assert.True(t, c.Encode(0, 0, codec.HostIndices(nil), rig.Stream))
	assert.True(t, c.Decode(1, 0, codec.HostIndices([]codec.PageIndexPair{}), nil))
	assert.Equal(t, before.BatchCalls, dev.Stats().BatchCalls)
	assert.False(t, c.Encode(9, 0, codec.HostIndices(nil), rig.Stream), "an unknown lifecycle fails even when empty")
}

func TestDefaultCodecQueries(t *testing.T) {
	c := codec.NewDefault()
	// Before Configure every query fails.
	assert.Zero(t, c.QueryColdPageBytes(0))
	assert.Negative(t, int(c.GetBatchingLayerGroupID(0)))
	assert.Equal(t, codec.BadLocation, c.QueryPageIndexLocation(0))

	require.True(t, c.Configure(configuredDefaultDescs()))
	assert.EqualValues(t, 16+48, c.QueryColdPageBytes(0), "sum of the group's SlotBytes")
	assert.EqualValues(t, 16+48, c.QueryColdPageBytes(2))
	assert.EqualValues(t, 32, c.QueryColdPageBytes(1))
	for _, lc := range lcs(0, 1, 2, 3) {
		assert.Equal(t, lc, c.GetBatchingLayerGroupID(lc), "identity batching")
		assert.Equal(t, codec.Host, c.QueryPageIndexLocation(lc))
	}
	assert.Zero(t, c.QueryColdPageBytes(4))
	assert.Negative(t, int(c.GetBatchingLayerGroupID(4)))
	assert.Equal(t, codec.BadLocation, c.QueryPageIndexLocation(4))
	assert.Equal(t, codec.BadLocation, c.QueryPageIndexLocation(-1))
}

func TestDefaultCodecConfiguresExactlyOnce(t *testing.T) {
	c := codec.NewDefault()
	require.True(t, c.Configure(configuredDefaultDescs()))
	assert.False(t, c.Configure(configuredDefaultDescs()), "a second Configure is rejected")
	assert.EqualValues(t, 64, c.QueryColdPageBytes(0), "and leaves the first configuration in force")

	// A rejected configuration also uses up the one call.
	r := codec.NewDefault()
	bad := configuredDefaultDescs()
	bad[1].Index = 7
	assert.False(t, r.Configure(bad))
	assert.False(t, r.Configure(configuredDefaultDescs()))
	assert.Zero(t, r.QueryColdPageBytes(0))

	assert.False(t, codec.NewDefault().Configure(nil), "no pool groups")
}

func TestDefaultCodecIsUnusableAfterClose(t *testing.T) {
	dev, rig := newRig(t, emu.Options{}, device.DeviceMemory)
	c := codec.NewDefault()
	require.True(t, c.Configure(rig.Groups))
	cold, err := rig.Alloc(device.DeviceMemory, 4*c.QueryColdPageBytes(0))
	require.NoError(t, err)
	require.NoError(t, codec.Destroy(c))
	require.NoError(t, codec.Destroy(c), "Close is idempotent")
	before := dev.Stats()
	assert.False(t, c.Encode(0, cold.Ptr(), codec.HostIndices([]codec.PageIndexPair{{Dst: 0, Src: 0}}), rig.Stream))
	assert.Zero(t, c.QueryColdPageBytes(0))
	assert.Equal(t, codec.BadLocation, c.QueryPageIndexLocation(0))
	assert.False(t, c.Configure(rig.Groups))
	assert.Equal(t, before.BatchCalls, dev.Stats().BatchCalls)
}

// countingStream is a device.Stream that accepts batches without running them,
// to measure the codec's own allocations.
type countingStream struct {
	device.Stream
	calls, descs int
}

func (s *countingStream) BatchCopy(d []device.CopyDesc) error {
	s.calls++
	s.descs += len(d)
	return nil
}

func TestDefaultCodecHotPathDoesNotAllocate(t *testing.T) {
	c := codec.NewDefault()
	require.True(t, c.Configure(configuredDefaultDescs()))
	enc := make([]codec.PageIndexPair, 256)
	dec := make([]codec.PageIndexPair, 256)
	for i := range enc {
		enc[i] = codec.PageIndexPair{Dst: int32(i), Src: int32(i % 4)}
		dec[i] = codec.PageIndexPair{Dst: int32(i % 4), Src: int32(i)}
	}
	s := &countingStream{}
	require.True(t, c.Encode(0, 0x900000, codec.HostIndices(enc), s)) // grows the reused buffer once
	allocs := testing.AllocsPerRun(50, func() {
		if !c.Encode(0, 0x900000, codec.HostIndices(enc), s) || !c.Decode(0, 0x900000, codec.HostIndices(dec), s) {
			panic("rejected")
		}
	})
	assert.Zero(t, allocs)
	assert.Equal(t, 1+2*51, s.calls)
	assert.Equal(t, (1+2*51)*256*2, s.descs)
}

func BenchmarkDefaultEncodeDescriptors(b *testing.B) {
	c := codec.NewDefault()
	descs := []layout.PoolGroupDesc{{Index: 0, NumSlots: 1 << 16, LifeCycles: lcs(0), Pools: pools(4096, 4096, 4096, 4096)}}
	if !c.Configure(descs) {
		b.Fatal("configure")
	}
	pairs := make([]codec.PageIndexPair, 1024)
	for i := range pairs {
		pairs[i] = codec.PageIndexPair{Dst: int32(i), Src: int32((i * 37) % (1 << 16))}
	}
	s := &countingStream{}
	b.ReportAllocs()
	for b.Loop() {
		c.Encode(0, 0x10000000, codec.HostIndices(pairs), s)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(pairs)*4), "ns/descriptor")
}
