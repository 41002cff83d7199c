package abimodel

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
)

// The ABI-form queries answer as the core's: a level per tier, the open
// caches, a buffer's stride and scratch sub-pages; an unknown buffer is an
// invalid argument, and every one but NumLevels fails once the manager is
// closed.
func TestABIQueries(t *testing.T) {
	m := newManager(t, Options{})
	assert.Equal(t, 2, m.NumLevels(), "one level per configured tier")
	n, err := m.NumOpenCaches()
	require.NoError(t, err)
	assert.Zero(t, n)
	c, err := m.CreateCache(CacheOptions{})
	require.NoError(t, err)
	n, err = m.NumOpenCaches()
	require.NoError(t, err)
	assert.Equal(t, 1, n, "a created cache is open")
	require.NoError(t, c.Close())

	loc, err := m.Core().Buffer(0, config.RoleKey)
	require.NoError(t, err)
	stride, err := m.PageStride(0, config.RoleKey)
	require.NoError(t, err)
	assert.Equal(t, loc.PageStride(), stride)
	spb, err := m.ScratchPagesPerBlock(0, config.RoleKey)
	require.NoError(t, err)
	assert.Equal(t, loc.ScratchPagesPerBlock, spb)
	_, err = m.PageStride(9, config.RoleKey)
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "no layer 9")
	_, err = m.ScratchPagesPerBlock(0, "nope")
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "no such role")

	require.NoError(t, m.Close())
	_, err = m.NumOpenCaches()
	assert.ErrorIs(t, err, core.ErrClosed)
	_, err = m.PageStride(0, config.RoleKey)
	assert.ErrorIs(t, err, core.ErrClosed)
	_, err = m.CreateStreamHandle()
	assert.ErrorIs(t, err, ErrDestroyed)
}

// ClampMaxSeqLenForMem takes the ABI's 64-bit batch size: one above
// math.MaxInt32 is an invalid argument naming batch_size; in range it
// answers as the core's.
func TestClampMaxSeqLenForMemRange(t *testing.T) {
	m := newManager(t, Options{})
	_, err := m.ClampMaxSeqLenForMem(math.MaxInt32+1, 100)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "batch_size")
	want, err := m.Core().ClampMaxSeqLenForMem(2, 100)
	require.NoError(t, err)
	got, err := m.ClampMaxSeqLenForMem(2, 100)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

// Resume and SetStream by native handle take any live stream of the
// manager's device and reject a handle of none, leaving the cache as it
// was.
func TestStreamsByHandle(t *testing.T) {
	m := newManager(t, Options{})
	h, err := m.CreateStreamHandle()
	require.NoError(t, err)
	c, err := m.CreateCache(CacheOptions{})
	require.NoError(t, err)
	bad := h + 1<<40
	assert.ErrorIs(t, c.ResumeOn(bad), core.ErrInvalidArgument)
	assert.Equal(t, core.Suspended, c.Core().Status(), "a rejected resume leaves the cache suspended")
	require.NoError(t, c.ResumeOn(h))
	assert.Equal(t, core.Active, c.Core().Status())
	assert.ErrorIs(t, c.SetStreamOf(bad), core.ErrInvalidArgument)
	h2, err := m.CreateStreamHandle()
	require.NoError(t, err)
	require.NoError(t, c.SetStreamOf(h2))
	require.NoError(t, c.Suspend())
	require.NoError(t, m.DestroyStream(h), "the cache left the first stream")
}

// The registry's Synchronize and BatchCopy work on a live stream's handle
// and name the stream argument for any other; memory of an unknown kind
// is refused before the size is looked at.
func TestRegistryStreamCalls(t *testing.T) {
	reg := &DeviceRegistry{}
	m := newManager(t, Options{Registry: reg})
	h, err := m.CreateStreamHandle()
	require.NoError(t, err)
	require.NoError(t, reg.Synchronize(h))
	require.NoError(t, reg.BatchCopy(h, nil))
	err = reg.Synchronize(0)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "stream")
	assert.ErrorIs(t, reg.BatchCopy(0, nil), core.ErrInvalidArgument)
	_, err = reg.Alloc(h, device.MemoryKind(-1), 0)
	assert.ErrorContains(t, err, "kind")
}

// ValidateConfig resolves the ABI configuration before validating it: a
// bad field of either step is an invalid configuration.
func TestValidateConfig(t *testing.T) {
	mc := ManagerConfig{Config: smallConfig(16)}
	require.NoError(t, ValidateConfig(mc))
	mc.TokensPerBlock = 0
	assert.ErrorIs(t, ValidateConfig(mc), core.ErrInvalidConfig)
}

// BlockKeys keys a sequence as blockhash.ChainDigests does; digest bytes
// that do not match the positions are an invalid argument naming
// digest_positions, and what ChainDigests refuses one naming block_keys.
func TestBlockKeys(t *testing.T) {
	want, err := blockhash.ChainDigests(blockhash.SHA256, blockhash.Scope{}, tpb, seq(0, 10), nil, true)
	require.NoError(t, err)
	got, err := BlockKeys(blockhash.SHA256, blockhash.Scope{}, tpb, seq(0, 10), nil, "", true)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	_, err = BlockKeys(blockhash.SHA256, blockhash.Scope{}, tpb, seq(0, 10), []uint64{1}, "short", true)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "digest_positions")
	_, err = BlockKeys(blockhash.SHA256, blockhash.Scope{}, 0, seq(0, 10), nil, "", true)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "block_keys")
}

// CommitDigestBytes checks the digests before committing: bytes that do
// not match the positions are an invalid argument naming digest_positions
// and commit nothing.
func TestCommitDigestBytesChecksTheDigests(t *testing.T) {
	m := newManager(t, Options{})
	c, err := m.CreateCache(CacheOptions{})
	require.NoError(t, err)
	err = c.CommitDigestBytes(seq(0, 4), []uint64{1}, "short", false)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "digest_positions")
	assert.Zero(t, c.Core().NumCommittedTokens())
}

// The registry's HostFunc and CopyFromHost work on a live stream's handle
// and name the stream argument for any other; copying nothing enqueues
// nothing.
func TestRegistryHostFuncAndCopy(t *testing.T) {
	reg := &DeviceRegistry{}
	m := newManager(t, Options{Registry: reg})
	h, err := m.CreateStreamHandle()
	require.NoError(t, err)
	ran := false
	require.NoError(t, reg.HostFunc(h, func() error { ran = true; return nil }))
	require.NoError(t, reg.Synchronize(h))
	assert.True(t, ran, "the host function ran in stream order")
	assert.ErrorIs(t, reg.HostFunc(0, func() error { return nil }), core.ErrInvalidArgument)

	p, err := m.AllocMemory(device.HostMapped, 8)
	require.NoError(t, err)
	require.NoError(t, reg.CopyFromHost(h, p, []byte{1, 2, 3, 4, 5, 6, 7, 8}))
	require.NoError(t, reg.CopyFromHost(h, p, nil))
	require.NoError(t, reg.Synchronize(h))
	err = reg.CopyFromHost(0, p, []byte{1})
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "stream")
}

// ScratchDesc is the core's scratch description, split into its parts; a
// suspended cache's is refused as the core refuses it.
func TestScratchDescParts(t *testing.T) {
	m := newManager(t, Options{})
	c, err := m.CreateCache(CacheOptions{})
	require.NoError(t, err)
	_, wantErr := c.Core().ScratchDesc(0)
	require.Error(t, wantErr)
	_, _, _, err = c.ScratchDesc(0)
	assert.Equal(t, wantErr, err)

	s, err := m.CreateStream()
	require.NoError(t, err)
	a := active(t, m, s, CacheOptions{}, seq(0, 8))
	want, err := a.Core().ScratchDesc(0)
	require.NoError(t, err)
	begin, end, slots, err := a.ScratchDesc(0)
	require.NoError(t, err)
	assert.Equal(t, want, core.ScratchDesc{Begin: begin, End: end, Slots: slots})
}
