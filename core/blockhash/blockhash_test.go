package blockhash

import (
	"encoding/binary"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"
)

// The vectors were computed independently (Python hashlib) from the
// specification in the package doc; every binding must reproduce them.
func TestKeysMatchTheSpecification(t *testing.T) {
	root := Scope{}.Root()
	assert.Equal(t, Key(0x46dd8adc732be26c), root)
	assert.Equal(t, []Key{0x360d651c5f3d3835, 0x35f5c392fa534ee5},
		Chain(Scope{}, 4, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}), "full blocks only")

	tenant := Scope{LoRAID: 7, Salt: "tenant-a"}
	assert.Equal(t, Key(0x4bf678dd427583f6), tenant.Root())
	assert.Equal(t, tenant.Root(), Scope{LoRAID: 7, HasLoRA: true, Salt: "tenant-a"}.Root(),
		"a non-zero id is an adapter with or without HasLoRA")
	assert.Equal(t, Key(0x9826bf5590b90922), NewHasher().Next(tenant.Root(), []int32{-1, 2147483647, 0, 42}))
	assert.Equal(t, Key(0x3ba47bf6fbd7ed72), Scope{Salt: "tenant-a"}.Root())
}

// LoRA adapter 0 and no adapter are different scopes (KVCacheManagerV2's
// ReuseScope(lora_id=0) and ReuseScope(lora_id=None)).
func TestLoRAZeroIsNotNoLoRA(t *testing.T) {
	assert.Equal(t, Key(0xc521ebe97d2b725c), LoRA(0).Root())
	assert.NotEqual(t, Scope{}.Root(), LoRA(0).Root())
	assert.False(t, Scope{}.HasAdapter())
	assert.True(t, LoRA(0).HasAdapter())
}

func TestHasherDoesNotAllocate(t *testing.T) {
	x := NewHasher()
	toks := make([]int32, 32)
	x.Next(0, toks)
	assert.Zero(t, testing.AllocsPerRun(100, func() { x.Next(1, toks) }))
}

// An XXH3 key is the 64-bit XXH3 hash (seed 0) of the bytes the
// specification hashes with SHA-256; the scope hash stays SHA-256.
func TestXXH3KeysHashTheSpecifiedBytes(t *testing.T) {
	x, err := NewHasherFor(XXH3)
	require.NoError(t, err)
	root := Scope{}.Root()
	toks := []int32{-1, 2147483647, 0, 42}
	b := binary.LittleEndian.AppendUint64(nil, uint64(root))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(toks)))
	for _, tok := range toks {
		b = binary.LittleEndian.AppendUint32(b, uint32(tok))
	}
	assert.Equal(t, Key(xxh3.Hash(b)), x.Next(root, toks))
	assert.NotEqual(t, NewHasher().Next(root, toks), x.Next(root, toks))
	assert.Zero(t, testing.AllocsPerRun(100, func() { x.Next(1, toks) }))

	_, err = NewHasherFor(Algorithm(7))
	assert.ErrorContains(t, err, "unknown algorithm 7")
}

func mustDigest(t *testing.T, h string) Digest {
	t.Helper()
	b, err := hex.DecodeString(h)
	require.NoError(t, err)
	require.Len(t, b, DigestSize)
	return Digest(b)
}

// A block with digest tokens is keyed by the specification's flagged
// encoding (vectors computed independently with Python hashlib, as
// tests/conformance/blockkeys.vec has them); a text block keeps its key, the
// partial tail block is keyed too, and another digest is another key.
func TestDigestTokensAreKeyedAsSpecified(t *testing.T) {
	a := mustDigest(t, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	b := mustDigest(t, "657f504b469e7f2a0d8ce3cd481194445f99ee57b40fc9d7fe28d8ecad1fc09b")
	image := []int32{1, 2, 3, 4, 0, 1001, 1002, 1003, 5}
	keys, err := ChainDigests(SHA256, Scope{}, 4, image, []DigestAt{{4, a}}, true)
	require.NoError(t, err)
	assert.Equal(t, []Key{0x360d651c5f3d3835, 0x49318da9655b654e, 0x514815ef05d2367b}, keys)
	full, err := ChainDigests(SHA256, Scope{}, 4, image, []DigestAt{{4, a}}, false)
	require.NoError(t, err)
	assert.Equal(t, keys[:2], full, "without the partial tail")

	other, err := ChainDigests(SHA256, Scope{}, 4, image, []DigestAt{{4, b}}, true)
	require.NoError(t, err)
	assert.Equal(t, []Key{0x360d651c5f3d3835, 0xcaa5182d1657f041, 0x8936a690b839b21d}, other)

	mid, err := ChainDigests(SHA256, Scope{LoRAID: 7, Salt: "tenant-a"}, 4, []int32{7, 0, 8, 9, 10, 11}, []DigestAt{{1, b}}, true)
	require.NoError(t, err)
	assert.Equal(t, []Key{0x6b614a6d77da7b88, 0x47d87c34b85111b3}, mid)

	two, err := ChainDigests(SHA256, LoRA(0), 2, []int32{0, 0, -1, 0}, []DigestAt{{0, a}, {1, b}, {3, a}}, true)
	require.NoError(t, err)
	assert.Equal(t, []Key{0x89719278786baefa, 0xb4bfbf842335d948}, two)

	text, err := ChainDigests(SHA256, Scope{}, 4, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, nil, false)
	require.NoError(t, err)
	assert.Equal(t, Chain(Scope{}, 4, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}), text, "text blocks keep their keys")
}

// The value of a digest position's token never enters the key; a digest
// and a text token are never the same token.
func TestDigestPositionIgnoresItsTokenValue(t *testing.T) {
	a := Digest{1}
	x := NewHasher()
	assert.Equal(t, x.NextDigests(5, []int32{0, 9}, []DigestAt{{0, a}}), x.NextDigests(5, []int32{12345, 9}, []DigestAt{{0, a}}))
	assert.NotEqual(t, x.Next(5, []int32{0, 9}), x.NextDigests(5, []int32{0, 9}, []DigestAt{{0, Digest{}}}))
	xx, err := NewHasherFor(XXH3)
	require.NoError(t, err)
	assert.NotEqual(t, xx.Next(5, []int32{0, 9}), xx.NextDigests(5, []int32{0, 9}, []DigestAt{{0, a}}))
	assert.Zero(t, testing.AllocsPerRun(100, func() { x.NextDigests(1, []int32{0, 9}, []DigestAt{{0, a}}) }))
}

// Digest positions must be sorted, each once, inside the tokens; the error
// names the entry.
func TestDigestPositionsAreChecked(t *testing.T) {
	for _, c := range []struct {
		d    []DigestAt
		want string
	}{
		{[]DigestAt{{Pos: 4}}, "digest_positions[0]: position 4 outside the 4 tokens"},
		{[]DigestAt{{Pos: -1}}, "digest_positions[0]: position -1"},
		{[]DigestAt{{Pos: 2}, {Pos: 2}}, "digest_positions[1]: position 2 does not follow 2"},
		{[]DigestAt{{Pos: 3}, {Pos: 1}}, "digest_positions[1]: position 1 does not follow 3"},
	} {
		_, err := ChainDigests(SHA256, Scope{}, 2, make([]int32, 4), c.d, true)
		assert.ErrorContains(t, err, c.want)
	}
	_, err := ChainDigests(SHA256, Scope{}, 0, nil, nil, true)
	assert.ErrorContains(t, err, "tokens_per_block")
}
