package blockhash

import (
	"encoding/binary"
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
