package blockhash

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The vectors were computed independently (Python hashlib) from the
// specification in the package doc; every binding must reproduce them.
func TestKeysMatchTheSpecification(t *testing.T) {
	root := Scope{}.Root()
	assert.Equal(t, Key(0x46dd8adc732be26c), root)
	assert.Equal(t, []Key{0x360d651c5f3d3835, 0x35f5c392fa534ee5},
		Chain(Scope{}, 4, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}), "full blocks only")

	tenant := Scope{LoRAID: 7, Salt: "tenant-a"}
	assert.Equal(t, Key(0x6246b3e7bb3c5a9a), tenant.Root())
	assert.Equal(t, Key(0xbc645c1085a808bd), NewHasher().Next(tenant.Root(), []int32{-1, 2147483647, 0, 42}))
}

func TestHasherDoesNotAllocate(t *testing.T) {
	x := NewHasher()
	toks := make([]int32, 32)
	x.Next(0, toks)
	assert.Zero(t, testing.AllocsPerRun(100, func() { x.Next(1, toks) }))
}
