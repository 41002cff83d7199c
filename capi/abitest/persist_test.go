package abitest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The rules of disk_persistent through the C ABI: a persistent disk tier
// survives kvcm_manager_destroy and the next manager on its directory reuses
// the committed blocks there; a second live manager on the directory is
// KVCM_ERR_INVALID_STATE; the flag without a disk tier, or with a codec
// without an identity, is KVCM_ERR_INVALID_CONFIG naming
// cache_tiers[i].persistent; a caller whose struct_size ends before it
// never sets it.

// persistConfig is a 4-page GPU tier over a 32-page disk tier in dir.
func persistConfig(dir string) Config {
	cfg := smallConfig(4, 0)
	cfg.Tiers = append(cfg.Tiers, Tier{Kind: 2, Quota: 32 * pageBytes, Path: dir})
	cfg.DiskPersistent = true
	return cfg
}

// fillDisk serves 8 prompts of 2 blocks each through a 4-page GPU tier, so
// the first ones are evicted to the disk tier, and returns the prompts.
func fillDisk(t *testing.T, m uint64) [][]int32 {
	t.Helper()
	s, err := CreateStream(m)
	require.NoError(t, err)
	var prompts [][]int32
	for i := range int32(8) {
		p := seq(100*i, 2*tpb)
		serveV2(t, m, s, Scope{}, p)
		prompts = append(prompts, p)
	}
	require.NoError(t, Synchronize(s))
	require.NoError(t, DestroyStream(m, s))
	return prompts
}

// TestPersistentDiskTierIsReusedAfterDestroy: the blocks a destroyed
// manager left on its persistent disk tier are found by the next manager on
// the directory; without disk_persistent nothing is.
func TestPersistentDiskTierIsReusedAfterDestroy(t *testing.T) {
	noLeaks(t)
	for _, persistent := range []bool{true, false} {
		cfg := persistConfig(t.TempDir())
		cfg.DiskPersistent = persistent
		m, err := CreateManager(cfg, nil)
		require.NoError(t, err)
		prompts := fillDisk(t, m)
		require.NoError(t, DestroyManager(m))

		m, err = CreateManager(cfg, nil)
		require.NoError(t, err)
		n, err := ProbeReuse(m, 0, "", prompts[0])
		require.NoError(t, err)
		if persistent {
			assert.Equal(t, int64(2*tpb), n, "the first prompt was evicted to disk and is found again")
		} else {
			assert.Zero(t, n, "a tier that is not persistent leaves nothing")
		}
		require.NoError(t, DestroyManager(m))
	}
}

// TestSecondManagerOnPersistentDirIsRefused: while one manager holds a
// persistent directory another is KVCM_ERR_INVALID_STATE; after the first
// is destroyed it starts.
func TestSecondManagerOnPersistentDirIsRefused(t *testing.T) {
	noLeaks(t)
	cfg := persistConfig(t.TempDir())
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err)
	_, err = CreateManager(cfg, nil)
	requireCode(t, err, InvalidState, "locked")
	assert.False(t, IsPoisoned())
	require.NoError(t, DestroyManager(m))
	m, err = CreateManager(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, DestroyManager(m))
}

// TestDiskPersistentNeedsADiskTierAndACodecIdentity: disk_persistent on a
// tier list without a disk tier names the last tier's persistent; with a
// codec object without an identity, the disk tier's.
func TestDiskPersistentNeedsADiskTierAndACodecIdentity(t *testing.T) {
	noLeaks(t)
	cfg := smallConfig(4, 4)
	cfg.DiskPersistent = true
	_, err := CreateManager(cfg, nil)
	requireCode(t, err, InvalidConfig, "cache_tiers[1].persistent", "only a disk tier")

	codec, err := NewCodec(ConcatCodec)
	require.NoError(t, err)
	_, err = CreateManager(persistConfig(t.TempDir()), codec)
	requireCode(t, err, InvalidConfig, "cache_tiers[1].persistent", "identity")
}

// TestDiskPersistentNeedsItsStructSize: a caller of ABI version 1 never
// wrote disk_persistent, so it is not read.
func TestDiskPersistentNeedsItsStructSize(t *testing.T) {
	noLeaks(t)
	cfg := smallConfig(4, 4)
	cfg.DiskPersistent = true
	cfg.StructSize = ConfigSizeV1
	m, err := CreateManager(cfg, nil)
	require.NoError(t, err, "a version 1 struct ends before disk_persistent")
	require.NoError(t, DestroyManager(m))
}
