package abitest

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/internal/testkit/devicetest"
)

const (
	tpb       = 4
	pageBytes = 256 // 2 layers x (key + value) x 64 bytes: one pool
)

func smallConfig(gpuPages, hostPages int64) Config {
	layer := func(id int32) Layer {
		return Layer{ID: id, Buffers: []Buffer{{"key", 64}, {"value", 64}}}
	}
	cfg := Config{TokensPerBlock: tpb, Tiers: []Tier{{Kind: 0, Quota: gpuPages * pageBytes}}, Layers: []Layer{layer(0), layer(1)}, Device: testDevice()}
	if hostPages > 0 {
		cfg.Tiers = append(cfg.Tiers, Tier{Kind: 1, Quota: hostPages * pageBytes})
	}
	return cfg
}

// testDevice is the device kind the tests run on, as devicetest picks it:
// KVCM_DEVICE=cuda (or auto on a GPU machine) runs them on a GPU, the
// emulated device otherwise. KVCM_ABITEST_DEVICE=cuda, the older switch,
// still works.
func testDevice() int32 {
	name, err := devicetest.Resolved()
	if err != nil {
		panic(err)
	}
	if name == "cuda" || os.Getenv("KVCM_ABITEST_DEVICE") == "cuda" {
		return 2
	}
	return 1
}

// noLeaks checks at the end of the test that every handle it made is gone.
func noLeaks(t *testing.T) {
	t.Helper()
	before := LiveHandles()
	t.Cleanup(func() { assert.Equal(t, before, LiveHandles(), "live handles leaked") })
}

func requireCode(t *testing.T, err error, code int32, contains ...string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, CodeName(code), CodeName(CodeOf(err)), "error: %v", err)
	for _, c := range contains {
		assert.Contains(t, err.Error(), c)
	}
}

func seq(from, n int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = from + int32(i)
	}
	return out
}

func TestVersionsAndFunctionTable(t *testing.T) {
	assert.Equal(t, uint32(2), ABIVersion())
	assert.Equal(t, "0.1.0", LibraryVersion())
	for _, v := range []uint32{1, 2} {
		ok, size, abi, slots := APITable(v)
		require.True(t, ok, "version %d", v)
		assert.Equal(t, uint32(2), abi, "the one table serves every version up to the library's")
		assert.Greater(t, size, uint32(8))
		assert.True(t, slots, "table slots are the exported functions")
	}
	ok, _, _, _ := APITable(0)
	assert.False(t, ok, "version 0")
	ok, _, _, _ = APITable(3)
	assert.False(t, ok, "a version newer than the library")
	code, msg := StatusOfNull()
	assert.Equal(t, OK, code)
	assert.Equal(t, "", msg)
	assert.Equal(t, "KVCM_ERR_INVALID_HANDLE", CodeName(InvalidHandle))
	assert.Equal(t, "KVCM_ERR_UNKNOWN", CodeName(999))
}

func TestManagerWithDefaultCodec(t *testing.T) {
	noLeaks(t)
	for _, kind := range []CodecKind{NoCodec, DefaultCodec} {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			var codec *Codec
			if kind != NoCodec {
				var err error
				codec, err = NewCodec(kind)
				require.NoError(t, err)
			}
			m, err := CreateManager(smallConfig(8, 16), codec)
			require.NoError(t, err)
			require.NotZero(t, m)
			n, err := TokensPerBlock(m)
			require.NoError(t, err)
			assert.Equal(t, int32(tpb), n)
			lgs, err := NumLayerGroups(m)
			require.NoError(t, err)
			assert.Equal(t, int32(1), lgs)
			levels, err := NumLevels(m)
			require.NoError(t, err)
			assert.Equal(t, int32(2), levels)
			dk, err := DeviceKind(m)
			require.NoError(t, err)
			assert.Equal(t, testDevice(), dk)
			q, err := Quota(m, 1)
			require.NoError(t, err)
			assert.Equal(t, int64(16*pageBytes), q)
			_, err = Quota(m, 5)
			requireCode(t, err, InvalidArgument, "level")
			require.NoError(t, DestroyManager(m))
		})
	}
}

func TestDefaultCodecObjectIsConsumedOnce(t *testing.T) {
	noLeaks(t)
	before := LiveHandles()
	codec, err := NewCodec(DefaultCodec)
	require.NoError(t, err)
	assert.Equal(t, before+1, LiveHandles(), "the codec object holds a handle")
	m, err := CreateManager(smallConfig(8, 0), codec)
	require.NoError(t, err)
	assert.Equal(t, before+1, LiveHandles(), "the codec's handle was consumed, the manager's made")

	_, err = CreateManager(smallConfig(8, 0), codec)
	requireCode(t, err, InvalidHandle, "already consumed")
	requireCode(t, codec.Destroy(), InvalidHandle)
	require.NoError(t, DestroyManager(m))

	// Destroyed without ever being handed on.
	codec, err = NewCodec(DefaultCodec)
	require.NoError(t, err)
	require.NoError(t, codec.Destroy())
	requireCode(t, codec.Destroy(), InvalidHandle)
}

// TestCodecConsumedOnEveryPath: a C codec's destroy slot runs exactly once,
// whether creation succeeds or fails, and whatever the failure.
func TestCodecConsumedOnEveryPath(t *testing.T) {
	noLeaks(t)
	good := smallConfig(8, 16)
	badConfig := smallConfig(8, 16)
	badConfig.TokensPerBlock = 0
	smallStruct := smallConfig(8, 16)
	smallStruct.StructSize = 8
	noVersion := smallConfig(8, 16)
	noVersion.ABIVersion = -1
	cases := []struct {
		name     string
		kind     CodecKind
		cfg      Config
		nullCfg  bool
		nullOut  bool
		code     int32
		contains []string
	}{
		{"success", ConcatCodec, good, false, false, OK, nil},
		{"configure returns false", RejectingCodec, good, false, false, CodecRejected, []string{"Configure returned false"}},
		// The codec's size_t is reported as returned, not as "0 bytes".
		{"query_cold_page_bytes returns SIZE_MAX", SizeMaxCodec, good, false, false, CodecRejected,
			[]string{"QueryColdPageBytes returned 18446744073709551615 bytes (SIZE_MAX"}},
		{"vtable without encode", NoEncodeCodec, good, false, false, InvalidArgument, []string{"codec.vtable.encode"}},
		{"vtable without abi_version", NoVersionCodec, good, false, false, InvalidArgument, []string{"codec.vtable.abi_version"}},
		{"invalid config", ConcatCodec, badConfig, false, false, InvalidConfig, []string{"tokens_per_block"}},
		{"NULL config", ConcatCodec, good, true, false, InvalidArgument, []string{"config: must not be NULL"}},
		{"NULL out", ConcatCodec, good, false, true, InvalidArgument, []string{"out: must not be NULL"}},
		{"struct_size too small", ConcatCodec, smallStruct, false, false, InvalidArgument, []string{"config.struct_size"}},
		{"abi_version 0", ConcatCodec, noVersion, false, false, InvalidArgument, []string{"config.abi_version"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := ReadCounters()
			codec, err := NewCodec(tc.kind)
			require.NoError(t, err)
			if tc.nullCfg || tc.nullOut {
				err = CreateManagerNil(tc.cfg, codec, tc.nullCfg, tc.nullOut)
				requireCode(t, err, tc.code, tc.contains...)
				assert.Equal(t, int64(1), ReadCounters().Sub(before).Destroyed, "destroyed exactly once")
				return
			}
			m, err := CreateManager(tc.cfg, codec)
			if tc.code != OK {
				requireCode(t, err, tc.code, tc.contains...)
				assert.Zero(t, m, "out is zeroed on failure")
				assert.Equal(t, int64(1), ReadCounters().Sub(before).Destroyed, "destroyed exactly once")
				return
			}
			require.NoError(t, err)
			d := ReadCounters().Sub(before)
			assert.Equal(t, int64(1), d.Configured)
			assert.Zero(t, d.Destroyed, "the manager owns the codec")
			require.NoError(t, DestroyManager(m))
			assert.Equal(t, int64(1), ReadCounters().Sub(before).Destroyed, "destroyed exactly once, by the manager")
		})
	}
	t.Run("NULL vtable", func(t *testing.T) {
		codec, err := NewCodec(NullVtableCodec)
		require.NoError(t, err)
		_, err = CreateManager(good, codec)
		requireCode(t, err, InvalidArgument, "codec.vtable", "NULL")
	})
	t.Run("kvcm_cold_page_codec_destroy", func(t *testing.T) {
		before := ReadCounters()
		codec, err := NewCodec(ConcatCodec)
		require.NoError(t, err)
		require.NoError(t, codec.Destroy())
		assert.Equal(t, int64(1), ReadCounters().Sub(before).Destroyed)
	})
}

// pattern is the content of one buffer page.
func pattern(tag, block int, layer int32, role string) []byte {
	out := make([]byte, 64)
	x := uint32(tag*7919+block*104729) ^ uint32(layer)*2654435761 ^ uint32(len(role))*40503
	for i := range out {
		x = x*1664525 + 1013904223
		out[i] = byte(x >> 24)
	}
	return out
}

type engine struct {
	t       *testing.T
	m       uint64
	s       uint64
	scratch uint64
}

// each calls fn for every buffer page of an ACTIVE cache, with a scratch
// offset unique to the page.
func (e *engine) each(c uint64, fn func(off uint64, addr uint64, block int, layer int32, role string)) {
	off := uint64(0)
	for _, layer := range []int32{0, 1} {
		for _, role := range []string{"key", "value"} {
			loc, err := GetBufferLocation(e.m, layer, role)
			require.NoError(e.t, err)
			idx, _, err := BasePageIndices(c, loc.LayerGroup, -1)
			require.NoError(e.t, err)
			for b, base := range idx {
				require.NotEqual(e.t, int32(-1), base)
				fn(off, loc.Address(base), b, layer, role)
				off += uint64(loc.Bytes)
			}
		}
	}
}

func (e *engine) write(c uint64, tag int) {
	var copies []Copy
	e.each(c, func(off, addr uint64, b int, layer int32, role string) {
		WriteHost(e.scratch+off, pattern(tag, b, layer, role))
		copies = append(copies, Copy{Dst: addr, Src: e.scratch + off, Size: 64})
	})
	require.NoError(e.t, BatchCopy(e.s, copies))
	require.NoError(e.t, Synchronize(e.s))
}

func (e *engine) verify(c uint64, tag int) int {
	var copies []Copy
	e.each(c, func(off, addr uint64, _ int, _ int32, _ string) {
		copies = append(copies, Copy{Dst: e.scratch + off, Src: addr, Size: 64})
	})
	require.NoError(e.t, BatchCopy(e.s, copies))
	require.NoError(e.t, Synchronize(e.s))
	n := 0
	e.each(c, func(off, _ uint64, b int, layer int32, role string) {
		require.Equal(e.t, pattern(tag, b, layer, role), ReadHost(e.scratch+off, 64), "block %d layer %d %s", b, layer, role)
		n++
	})
	return n
}

// compute runs a prompt: create, resume, resize, write, commit, suspend,
// close.
func (e *engine) compute(tokens []int32, tag int) {
	c, err := CreateCache(e.m, 0, "", tokens)
	require.NoError(e.t, err)
	require.NoError(e.t, Resume(c, e.s))
	n := int64(len(tokens))
	require.NoError(e.t, Resize(c, n, n))
	e.write(c, tag)
	require.NoError(e.t, Commit(c, tokens, false))
	require.NoError(e.t, Suspend(c))
	require.NoError(e.t, CloseCache(c))
}

// TestRoundTripThroughHostTier pushes a request's pages to the host tier
// through the codec and brings them back to the GPU, verified to the byte,
// for the default codec, the default codec object and the C codec.
func TestRoundTripThroughHostTier(t *testing.T) {
	noLeaks(t)
	for _, kind := range []CodecKind{NoCodec, DefaultCodec, ConcatCodec} {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			before := ReadCounters()
			var codec *Codec
			if kind != NoCodec {
				var err error
				codec, err = NewCodec(kind)
				require.NoError(t, err)
			}
			m, err := CreateManager(smallConfig(8, 16), codec)
			require.NoError(t, err)
			s, err := CreateStream(m)
			require.NoError(t, err)
			scratch, err := Alloc(m, MemoryHostMapped, 64*1024)
			require.NoError(t, err)
			e := &engine{t: t, m: m, s: s, scratch: scratch}

			a := seq(1, 16)
			e.compute(a, 1)
			e.compute(seq(1000, 32), 2) // fills the GPU: a's pages go to the host
			pages, err := MigrationPages(m)
			require.NoError(t, err)
			assert.Equal(t, int64(4), pages[PathGPUToHost], "a's 4 pages were encoded to the host")

			input := append(append([]int32{}, a...), 99)
			n, err := ProbeReuse(m, 0, "", input)
			require.NoError(t, err)
			assert.Equal(t, int64(16), n)
			c, err := CreateCache(m, 0, "", input)
			require.NoError(t, err)
			info, err := GetCacheInfo(c)
			require.NoError(t, err)
			assert.Equal(t, int64(16), info.ReusedToken)
			assert.Equal(t, CacheSuspended, info.Status)
			require.NoError(t, Resume(c, s))
			pages, err = MigrationPages(m)
			require.NoError(t, err)
			assert.Equal(t, int64(4), pages[PathHostToGPU], "decoded back")
			assert.Equal(t, 16, e.verify(c, 1), "every buffer page of every block")
			require.NoError(t, Suspend(c))
			require.NoError(t, CloseCache(c))
			require.NoError(t, Free(m, scratch))
			requireCode(t, Free(m, scratch), InvalidArgument, "ptr")
			require.NoError(t, DestroyManager(m))

			d := ReadCounters().Sub(before)
			if kind == ConcatCodec {
				assert.GreaterOrEqual(t, d.Encodes, int64(1))
				assert.GreaterOrEqual(t, d.Decodes, int64(1))
				assert.GreaterOrEqual(t, d.HostFuncs, d.Encodes+d.Decodes, "host functions ran on the codec's stream")
				assert.Equal(t, int64(1), d.Destroyed)
				assert.Zero(t, d.BadCalls)
			} else {
				assert.Zero(t, d.Encodes+d.Decodes)
			}
		})
	}
}

// A codec decode that returns false is KVCM_ERR_CODEC_FAILED, not
// CODEC_REJECTED: its pages are dropped, the cache can only be closed
// (DATA_LOST), the prefix is no longer offered and the next request
// recomputes it.
func TestFailedDecodeIsCodecFailed(t *testing.T) {
	noLeaks(t)
	codec, err := NewCodec(FailingDecodeCodec)
	require.NoError(t, err)
	m, err := CreateManager(smallConfig(8, 16), codec)
	require.NoError(t, err)
	s, err := CreateStream(m)
	require.NoError(t, err)
	scratch, err := Alloc(m, MemoryHostMapped, 64*1024)
	require.NoError(t, err)
	e := &engine{t: t, m: m, s: s, scratch: scratch}

	a := seq(1, 16)
	e.compute(a, 1)
	e.compute(seq(1000, 32), 2) // a's pages go to the host
	input := append(append([]int32{}, a...), 99)
	c, err := CreateCache(m, 0, "", input)
	require.NoError(t, err)
	requireCode(t, Resume(c, s), CodecFailed, "Decode", "returned false")
	requireCode(t, Resume(c, s), DataLost)
	n, err := ProbeReuse(m, 0, "", input)
	require.NoError(t, err)
	assert.Zero(t, n, "the dropped prefix is not offered")
	require.NoError(t, CloseCache(c))
	e.compute(a, 3) // recomputed: nothing to decode
	require.NoError(t, Free(m, scratch))
	require.NoError(t, DestroyManager(m))
}

// A disk tier's file that cannot be sized is KVCM_ERR_IO, not INTERNAL: the
// library is not poisoned.
func TestDiskErrorIsIO(t *testing.T) {
	noLeaks(t)
	// 1 MiB pages: a 1 PiB tier is 2^30 slots, within a pool group's range,
	// and a blob file no filesystem here holds (EFBIG, allocating nothing).
	const page = 1 << 20
	cfg := Config{TokensPerBlock: tpb, Device: testDevice(), Tiers: []Tier{{Kind: 0, Quota: 4 * page}, {Kind: 2, Quota: 8 * page, Path: t.TempDir()}},
		Layers: []Layer{{ID: 0, Buffers: []Buffer{{"key", page / 2}, {"value", page / 2}}}}}
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err)
	requireCode(t, ResizeLevel(m, 1, 1<<50), IOError, "disk")
	assert.False(t, IsPoisoned())
	require.NoError(t, DestroyManager(m))
}

func TestStaleAndForgedHandles(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	c, err := CreateCache(m, 0, "", seq(0, 8))
	require.NoError(t, err)

	_, err = TokensPerBlock(c)
	requireCode(t, err, InvalidHandle, "is a KV cache, not a manager")
	_, err = GetCacheInfo(m)
	requireCode(t, err, InvalidHandle, "is a manager, not a KV cache")
	_, err = TokensPerBlock(0)
	requireCode(t, err, InvalidHandle, "handle 0 is never valid")
	_, err = TokensPerBlock(1 << 40)
	requireCode(t, err, InvalidHandle, "not a live handle")

	require.NoError(t, CloseCache(c))
	requireCode(t, CloseCache(c), InvalidHandle, "not a live handle")
	_, err = GetCacheInfo(c)
	requireCode(t, err, InvalidHandle)

	// Destroying the manager closes its open caches and invalidates them.
	c2, err := CreateCache(m, 0, "", seq(0, 8))
	require.NoError(t, err)
	require.NoError(t, DestroyManager(m))
	_, err = GetCacheInfo(c2)
	requireCode(t, err, InvalidHandle)
	requireCode(t, DestroyManager(m), InvalidHandle, "not a live handle")
	_, err = TokensPerBlock(m)
	requireCode(t, err, InvalidHandle)
}

func TestNullAndBadArguments(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()

	requireCode(t, GetQuotaNullOut(m), InvalidArgument, "kvcm_manager_get_quota", "out: must not be NULL")
	requireCode(t, CreateCacheBadOptions(m), InvalidArgument, "options.struct_size")
	c, err := CreateCache(m, 0, "", seq(0, 8))
	require.NoError(t, err)
	requireCode(t, CommitNull(c, 3), InvalidArgument, "tokens", "is NULL but num_tokens is 3")
	requireCode(t, CommitNull(c, 0), InvalidState, "SUSPENDED") // NULL with a zero count passes the checks
	require.NoError(t, CloseCache(c))
	s, err := CreateStream(m)
	require.NoError(t, err)
	requireCode(t, EnqueueNullHostFunc(s), InvalidArgument, "fn: must not be NULL")
	requireCode(t, Synchronize(0), InvalidArgument, "stream")
	requireCode(t, Synchronize(0xdead_beef), InvalidArgument, "stream", "not a live stream")
	requireCode(t, Resume(c, s), InvalidHandle)
	_, err = Alloc(m, 7, 64)
	requireCode(t, err, InvalidArgument, "kind")
	_, err = Alloc(m, MemoryDevice, 0)
	requireCode(t, err, InvalidArgument, "size")
	_, err = GetBufferLocation(m, 0, "nope")
	requireCode(t, err, InvalidArgument)
	require.NoError(t, DestroyStream(m, s))
	requireCode(t, DestroyStream(m, s), InvalidArgument, "stream")
	requireCode(t, ResizeLevel(m, 0, -1), InvalidArgument, "quota")
}

func TestCallerBuffers(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 16), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCache(m, 0, "", seq(0, 12))
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 12, 12))

	idx, n, err := BasePageIndices(c, 0, -1)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Len(t, idx, 3)
	_, needed, err := BasePageIndices(c, 0, 2)
	requireCode(t, err, BufferTooSmall)
	assert.Equal(t, 3, needed, "the needed count is reported with the error")

	hot, err := PoolGroupDescs(m, 0, false)
	require.NoError(t, err)
	require.Len(t, hot, 1)
	assert.Equal(t, []int32{0}, hot[0].LifeCycles)
	assert.Equal(t, []int64{pageBytes}, hot[0].SlotBytes)
	assert.NotZero(t, hot[0].Bases[0])
	assert.Equal(t, int64(8), hot[0].NumSlots)
	cold, err := PoolGroupDescs(m, 1, false)
	require.NoError(t, err)
	require.Len(t, cold, 1)
	assert.Equal(t, []uint64{0}, cold[0].Bases, "cold storage is not exposed")
	assert.Equal(t, int64(16), cold[0].NumSlots)
	_, err = PoolGroupDescs(m, 0, true)
	requireCode(t, err, BufferTooSmall)

	total, free, _, err := StorageStats(m, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(8), total)
	assert.Equal(t, int64(5), free)

	// A too small buffer resets nothing.
	_, needed, err = PeakStats(m, 0, 0)
	requireCode(t, err, BufferTooSmall)
	assert.Equal(t, 1, needed)
	peaks, _, err := PeakStats(m, 0, 1)
	require.NoError(t, err)
	assert.Equal(t, []int64{3}, peaks)

	require.NoError(t, Suspend(c))
	require.NoError(t, CloseCache(c))
}

// The abitest helpers pass exact capacities to kvcm_manager_get_pool_group_descs,
// and a _test.go file cannot use cgo, so this test calls the export's Go body
// (the function cgo's C trampoline calls) directly. Its C types are
// integers and pointers of the same sizes.
//
//go:linkname exportGetPoolGroupDescs github.com/kvcm/kvcm/capi.kvcm_manager_get_pool_group_descs
func exportGetPoolGroupDescs(manager uint64, level int32, descs unsafe.Pointer, descsCap uint64, lcs unsafe.Pointer, lcsCap uint64,
	pools unsafe.Pointer, poolsCap uint64, numDescs, numLCs, numPools *uint64) unsafe.Pointer

//go:linkname exportDiscardStatus github.com/kvcm/kvcm/capi.discardStatus
func exportDiscardStatus(s unsafe.Pointer)

// exportStatus reads a kvcm_status* (its code and message) and frees it.
func exportStatus(s unsafe.Pointer) (int32, string) {
	if s == nil {
		return OK, ""
	}
	defer exportDiscardStatus(s)
	code := *(*int32)(s)
	var msg []byte
	for p := unsafe.Add(s, 4); *(*byte)(p) != 0; p = unsafe.Add(p, 1) {
		msg = append(msg, *(*byte)(p))
	}
	return code, string(msg)
}

// A buffer capacity too large to be a slice (here descs_cap = 2^40 with a
// valid buffer) is KVCM_ERR_INVALID_ARGUMENT, not an internal error: the
// library is not poisoned. Runs in a child process, as a failure would
// poison the library.
func TestPoolGroupDescsHugeCapacityIsAnArgumentError(t *testing.T) {
	if os.Getenv("KVCM_ABITEST_CHILD") == "huge-descs-cap" {
		m, err := CreateManager(smallConfig(8, 0), nil)
		require.NoError(t, err)
		var nd, nl, np uint64
		code, msg := exportStatus(exportGetPoolGroupDescs(m, 0, nil, 0, nil, 0, nil, 0, &nd, &nl, &np))
		require.Equal(t, OK, code, msg)
		descs := make([]byte, 48*(nd+1))
		lcs := make([]int32, nl+1)
		pools := make([]byte, 16*(np+1))
		code, msg = exportStatus(exportGetPoolGroupDescs(m, 0, unsafe.Pointer(&descs[0]), 1<<40, unsafe.Pointer(&lcs[0]), nl,
			unsafe.Pointer(&pools[0]), np, &nd, &nl, &np))
		fmt.Printf("CHILD-DESCS-RESULT code=%s poisoned=%v msg=%q\n", CodeName(code), IsPoisoned(), msg)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPoolGroupDescsHugeCapacityIsAnArgumentError$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVCM_ABITEST_CHILD=huge-descs-cap")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "CHILD-DESCS-RESULT", "child:\n%s", out)
	require.Contains(t, string(out), "code=KVCM_ERR_INVALID_ARGUMENT poisoned=false", "child:\n%s", out)
}

func TestEventsAreQueuedAndDropped(t *testing.T) {
	noLeaks(t)
	cfg := smallConfig(16, 0)
	cfg.EventQueueCapacity = 3
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCache(m, 0, "", seq(0, 20))
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 20, 20))
	require.NoError(t, Commit(c, seq(0, 20), false)) // 5 blocks stored, 2 dropped
	evs, dropped, err := DrainEvents(m, 2, 100)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	assert.Equal(t, uint64(2), dropped)
	assert.Equal(t, EventStored, evs[0].Kind)
	assert.Equal(t, seq(0, 4), evs[0].Tokens)
	assert.Equal(t, seq(4, 4), evs[1].Tokens)
	assert.Equal(t, evs[0].Seq+1, evs[1].Seq)
	evs, dropped, err = DrainEvents(m, 10, 3) // the oldest event's tokens do not fit
	requireCode(t, err, BufferTooSmall, "4 tokens")
	assert.Empty(t, evs)
	assert.Zero(t, dropped)
	evs, dropped, err = DrainEvents(m, 0, 3) // no room for an event: nothing to report
	require.NoError(t, err)
	assert.Empty(t, evs)
	assert.Zero(t, dropped)
	evs, _, err = DrainEvents(m, 10, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.Equal(t, seq(8, 4), evs[0].Tokens)
	require.NoError(t, Suspend(c))
	require.NoError(t, CloseCache(c))
}

func TestStreamAPI(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	dev, err := StreamAlloc(s, MemoryDevice, 256)
	require.NoError(t, err)
	host, err := Alloc(m, MemoryHostMapped, 256)
	require.NoError(t, err)
	data := []byte(strings.Repeat("kvcm-abi", 32))
	require.NoError(t, CopyFromHost(s, dev, data))
	require.NoError(t, BatchCopy(s, []Copy{{Dst: host, Src: dev, Size: 256}}))
	require.NoError(t, BatchCopy(s, nil))
	// A size no signed 64-bit count holds is an argument error naming the
	// element's field, not a negative size.
	requireCode(t, BatchCopy(s, []Copy{{Dst: host, Src: dev, Size: 8}, {Dst: host, Src: dev, Size: 1 << 63}}), InvalidArgument, "descs[1].size", "too large")
	runs := HostFuncRuns()
	require.NoError(t, EnqueueHostFunc(s, 0))
	require.NoError(t, Synchronize(s))
	assert.Equal(t, runs+1, HostFuncRuns())
	assert.Equal(t, data, ReadHost(host, 256))

	require.NoError(t, EnqueueHostFunc(s, 7))
	requireCode(t, Synchronize(s), DeviceError, "host function returned 7")
	if testDevice() == 1 { // on CUDA a wild copy may fault the context
		requireCode(t, BatchCopy(s, []Copy{{Dst: 16, Src: 32, Size: 8}}), DeviceError)
	}
	require.NoError(t, StreamFree(s, dev))
	requireCode(t, StreamFree(s, dev), InvalidArgument, "ptr")
	_, err = StreamAlloc(s, MemoryHostMapped, 64) // freed by the manager
	require.NoError(t, err)
}

// TestPoisoning runs in a child process: a panic inside the library becomes
// KVCM_ERR_INTERNAL, poisons it, and every later call fails fast with
// KVCM_ERR_POISONED while still consuming codecs.
func TestPoisoning(t *testing.T) {
	if os.Getenv("KVCM_ABITEST_CHILD") == "poison" {
		poisonChild(t)
		return
	}
	requireCode(t, DebugPanic("not enabled"), Unsupported, "KVCM_ENABLE_DEBUG_PANIC")
	assert.False(t, IsPoisoned())
	cmd := exec.Command(os.Args[0], "-test.run=^TestPoisoning$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVCM_ABITEST_CHILD=poison", "KVCM_ENABLE_DEBUG_PANIC=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	assert.Contains(t, string(out), "CHILD-POISON-OK", "child:\n%s", out)
	assert.False(t, IsPoisoned(), "the parent is untouched")
}

func poisonChild(t *testing.T) {
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	err = DebugPanic("boom")
	requireCode(t, err, Internal, "kvcm_debug_panic: panic: boom")
	require.True(t, IsPoisoned())
	_, err = TokensPerBlock(m)
	requireCode(t, err, Poisoned, "kvcm_manager_get_tokens_per_block", "poisoned by an earlier panic", "boom")
	requireCode(t, DestroyManager(m), Poisoned)
	before := ReadCounters()
	codec, err := NewCodec(ConcatCodec)
	require.NoError(t, err)
	_, err = CreateManager(smallConfig(8, 0), codec)
	requireCode(t, err, Poisoned)
	assert.Equal(t, int64(1), ReadCounters().Sub(before).Destroyed, "consumed even when poisoned")
	tiBefore := GetTestIndexStats()
	_, err = CPCreateDelegating(TestIndex{Slots: SlotsAll})
	requireCode(t, err, Poisoned)
	assert.Equal(t, int64(1), GetTestIndexStats().Sub(tiBefore).Destroyed, "a CP index object too")
	assert.Equal(t, uint32(2), ABIVersion(), "plain queries still answer")
	if !t.Failed() {
		fmt.Println("CHILD-POISON-OK")
	}
}

func TestPriorityCallback(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	before := PriorityCalls()
	c, err := CreateCacheWithPriority(m, seq(0, 12), 90)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 12, 12))
	require.NoError(t, Commit(c, seq(0, 12), false))
	assert.Equal(t, int64(3), PriorityCalls()-before, "one call per committed block")
	require.NoError(t, Suspend(c))
	require.NoError(t, CloseCache(c))
}

// TestPriorityCallbackFailureChangesNothing: a priority callback that
// reports failure fails the commit with INVALID_ARGUMENT and changes nothing;
// the same commit succeeds once the callback does.
func TestPriorityCallbackFailureChangesNothing(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCacheWithPriority(m, seq(0, 12), 90)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	// The priority function is asked as kvcm_kv_cache_resize allocates the
	// pages: its failure fails the resize, which changes nothing.
	SetPriorityFailure(7)
	err = Resize(c, 12, 12)
	SetPriorityFailure(0)
	requireCode(t, err, InvalidArgument)
	assert.Contains(t, err.Error(), "returned 7")
	info, err := GetCacheInfo(c)
	require.NoError(t, err)
	assert.Equal(t, int64(0), info.Capacity, "a failed resize allocates nothing")
	require.NoError(t, Resize(c, 12, 12), "the retry succeeds")
	require.NoError(t, Commit(c, seq(0, 12), false))
	info, err = GetCacheInfo(c)
	require.NoError(t, err)
	assert.Equal(t, int64(12), info.Committed)
	require.NoError(t, Suspend(c))
	require.NoError(t, CloseCache(c))
}

// TestConcurrentUse runs requests on one manager from several goroutines
// (each on its own stream) while others query it; run with -race.
func TestConcurrentUse(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(64, 64), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	const workers, rounds = 4, 20
	errs := make(chan error, workers+1)
	done := make(chan struct{})
	for w := range workers {
		go func() {
			errs <- func() error {
				s, err := CreateStream(m)
				if err != nil {
					return err
				}
				for r := range rounds {
					toks := seq(int32(w*1000+r%5*10), 8)
					c, err := CreateCache(m, int64(w%2), "", toks)
					if err != nil {
						return err
					}
					for _, step := range []func() error{
						func() error { return Resume(c, s) },
						func() error { return Resize(c, 8, 8) },
						func() error { return Commit(c, toks[len(toks)-8+int(mustCommitted(c)):], false) },
						func() error { return Suspend(c) },
					} {
						if err := step(); err != nil && CodeOf(err) != OutOfPages {
							CloseCache(c)
							return err
						}
					}
					if err := CloseCache(c); err != nil {
						return err
					}
				}
				return DestroyStream(m, s)
			}()
		}()
	}
	go func() {
		for {
			select {
			case <-done:
				errs <- nil
				return
			default:
			}
			LiveHandles()
			if _, _, _, err := BlockStats(m); err != nil {
				errs <- err
				return
			}
			if _, _, err := DrainEvents(m, 8, 64); err != nil {
				errs <- err
				return
			}
		}
	}()
	for range workers {
		require.NoError(t, <-errs)
	}
	close(done)
	require.NoError(t, <-errs)
}

func mustCommitted(c uint64) int64 {
	info, err := GetCacheInfo(c)
	if err != nil {
		return 0
	}
	return info.Committed
}

func TestConfigValidate(t *testing.T) {
	noLeaks(t)
	require.NoError(t, ValidateConfig(smallConfig(8, 16)))
	bad := smallConfig(8, 16)
	bad.Layers[1].Buffers[0].Size = 0
	requireCode(t, ValidateConfig(bad), InvalidConfig, "layers[1].buffers[0].size")
	bad = smallConfig(8, 16)
	bad.InitialPoolRatio = []float64{1, 2}
	requireCode(t, ValidateConfig(bad), InvalidConfig, "initial_pool_ratio")
	bad = smallConfig(8, 16)
	bad.ABIVersion = -1
	requireCode(t, ValidateConfig(bad), InvalidArgument, "config.abi_version")
	bad = smallConfig(8, 16)
	bad.MaxUtilForResume = 1.5
	requireCode(t, ValidateConfig(bad), InvalidConfig, "max_util_for_resume", "0 (unset)")
	xxh3 := smallConfig(8, 16)
	xxh3.BlockKey = 1
	require.NoError(t, ValidateConfig(xxh3), "KVCM_BLOCK_KEY_XXH3")
	bad = smallConfig(8, 16)
	bad.BlockKey = 2
	requireCode(t, ValidateConfig(bad), InvalidConfig, "block_key")
}

// A shared tier passes through the C ABI into the configuration: validated
// naming cache_tiers[i].<field> after the local tiers, and not read from a
// caller built against ABI version 1 (its struct_size does not cover it).
func TestConfigSharedTier(t *testing.T) {
	noLeaks(t)
	cfg := smallConfig(8, 16)
	cfg.Shared = &SharedTier{Addresses: "127.0.0.1:7101,127.0.0.1:7102", Namespace: "ns", TTLMs: 60000}
	require.NoError(t, ValidateConfig(cfg))
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err, "the manager does not contact the cluster")
	require.NoError(t, DestroyManager(m))

	for field, edit := range map[string]func(*SharedTier){
		"cache_tiers[2].namespace":    func(s *SharedTier) { s.Namespace = "a b" },
		"cache_tiers[2].addresses":    func(s *SharedTier) { s.Addresses = "" },
		"cache_tiers[2].addresses[1]": func(s *SharedTier) { s.Addresses = "127.0.0.1:1,nohost" },
		"cache_tiers[2].ttl":          func(s *SharedTier) { s.TTLMs = -1 },
		"cache_tiers[2].call_timeout": func(s *SharedTier) { s.CallTimeoutMs = -1 },
		"cache_tiers[2].write_policy": func(s *SharedTier) { s.WritePolicy = 9 },
	} {
		bad := smallConfig(8, 16)
		s := *cfg.Shared
		edit(&s)
		bad.Shared = &s
		requireCode(t, ValidateConfig(bad), InvalidConfig, field)
		bad.StructSize = ConfigSizeV1
		require.NoError(t, ValidateConfig(bad), "a version 1 caller has no shared_tier")
	}
}

// Quotas are sized with checked arithmetic: a quota of 2^63-1 is an error
// naming its field (or kvcm_manager_resize_level's quota), not an overflowed
// size.
func TestHugeQuotaNamesTheField(t *testing.T) {
	noLeaks(t)
	cfg := smallConfig(8, 0)
	cfg.Tiers[0].Quota = math.MaxInt64
	_, err := CreateManager(cfg, nil)
	requireCode(t, err, InvalidConfig, "cache_tiers[0].quota", "more than the 2147483647 a pool group can index")
	cfg = smallConfig(8, 16)
	cfg.Tiers[1].Quota = math.MaxInt64
	_, err = CreateManager(cfg, nil)
	requireCode(t, err, InvalidConfig, "cache_tiers[1].quota")

	m, err := CreateManager(smallConfig(8, 16), nil)
	require.NoError(t, err)
	for _, level := range []int32{0, 1} {
		requireCode(t, ResizeLevel(m, level, math.MaxInt64), InvalidArgument, "quota: ", "more than the 2147483647")
	}
	q, err := Quota(m, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(8*pageBytes), q, "a failed resize changes nothing")
	require.NoError(t, DestroyManager(m))
}

// max_util_for_resume 0 is unset: a zero-initialized config resumes up to the
// default 0.97, while a set value is used as is.
func TestZeroMaxUtilForResumeIsTheDefault(t *testing.T) {
	noLeaks(t)
	for _, tc := range []struct {
		util float64
		code int32
	}{{0, OK}, {0.5, ResumeRefused}} {
		cfg := smallConfig(4, 0)
		cfg.MaxUtilForResume = tc.util
		m, err := CreateManager(cfg, nil)
		require.NoError(t, err)
		s, err := CreateStream(m)
		require.NoError(t, err)
		a, err := CreateCache(m, 0, "", seq(0, 12))
		require.NoError(t, err)
		require.NoError(t, Resume(a, s))
		require.NoError(t, Resize(a, 12, -1)) // 3 of the 4 GPU pages
		b, err := CreateCache(m, 0, "", seq(100, 4))
		require.NoError(t, err)
		err = Resume(b, s)
		if tc.code == OK {
			require.NoError(t, err, "0.75 is below the default 0.97")
		} else {
			requireCode(t, err, tc.code, "resume refused")
		}
		require.NoError(t, CloseCache(b))
		require.NoError(t, CloseCache(a))
		require.NoError(t, DestroyManager(m))
	}
}

// TestDestroyStreamInUseIsRefused: kvcm_manager_destroy_stream fails with
// INVALID_STATE naming the ACTIVE cache that uses the stream, and changes
// nothing: the stream and the cache keep working, and once the cache is
// suspended the stream goes, with every handle released.
func TestDestroyStreamInUseIsRefused(t *testing.T) {
	noLeaks(t)
	m, err := CreateManager(smallConfig(8, 16), nil)
	require.NoError(t, err)
	s, err := CreateStream(m)
	require.NoError(t, err)
	c, err := CreateCache(m, 0, "", seq(0, 8))
	require.NoError(t, err)
	info, err := GetCacheInfo(c)
	require.NoError(t, err)
	require.NoError(t, Resume(c, s))
	require.NoError(t, Resize(c, 8, 8))

	requireCode(t, DestroyStream(m, s), InvalidState, fmt.Sprintf("ACTIVE cache %d", info.ID))
	require.NoError(t, Commit(c, seq(0, 8), false), "the cache still runs on the stream")
	require.NoError(t, Synchronize(s), "the stream is still alive")
	require.NoError(t, Suspend(c))
	require.NoError(t, DestroyStream(m, s))
	require.NoError(t, CloseCache(c))
	require.NoError(t, DestroyManager(m))
}
