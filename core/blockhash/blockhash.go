// Package blockhash defines block identity: the chained content hash that keys
// committed blocks in the radix tree and names blocks in the CP-aware
// interface, identical in every language binding.
//
// The hash of a scope is the first 8 bytes, read little-endian, of
// SHA-256("kvcm-scope-v1" ‖ lora_id:i64le ‖ len(salt):u32le ‖ salt). The key of
// a block is the first 8 bytes, little-endian, of
// SHA-256(parent:u64le ‖ n:u32le ‖ token_0:i32le ‖ … ‖ token_{n-1}:i32le),
// where parent is the key of the previous block, or the scope hash for the
// first block.
package blockhash

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
)

// Key is a block's chained content hash.
type Key uint64

// Scope separates caches that must never share blocks even for equal tokens:
// a LoRA adapter id and an optional salt (for example a tenant).
type Scope struct {
	LoRAID int64
	Salt   string
}

// Root returns the key every chain of this scope starts from.
func (s Scope) Root() Key {
	h := sha256.New()
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(s.LoRAID))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(s.Salt)))
	h.Write([]byte("kvcm-scope-v1"))
	h.Write(b[:])
	h.Write([]byte(s.Salt))
	return sum(h)
}

// Hasher computes block keys; reuse one to avoid allocations. Not safe for
// concurrent use.
type Hasher struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

// NewHasher returns a Hasher.
func NewHasher() *Hasher { return &Hasher{h: sha256.New()} }

// Next returns the key of the block holding tokens after the block keyed parent.
func (x *Hasher) Next(parent Key, tokens []int32) Key {
	n := 12 + 4*len(tokens)
	if cap(x.buf) < n {
		x.buf = make([]byte, n)
	}
	buf := x.buf[:n]
	binary.LittleEndian.PutUint64(buf, uint64(parent))
	binary.LittleEndian.PutUint32(buf[8:], uint32(len(tokens)))
	enc := buf[12:]
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(enc[4*i:4*i+4], uint32(t))
	}
	x.buf = buf
	x.h.Reset()
	x.h.Write(x.buf)
	return Key(binary.LittleEndian.Uint64(x.h.Sum(x.sum[:0])))
}

// Chain returns the keys of the full blocks of tokens in scope.
func Chain(scope Scope, tokensPerBlock int, tokens []int32) []Key {
	x := NewHasher()
	keys := make([]Key, 0, len(tokens)/tokensPerBlock)
	k := scope.Root()
	for i := 0; i+tokensPerBlock <= len(tokens); i += tokensPerBlock {
		k = x.Next(k, tokens[i:i+tokensPerBlock])
		keys = append(keys, k)
	}
	return keys
}

func sum(h hash.Hash) Key {
	var out [sha256.Size]byte
	return Key(binary.LittleEndian.Uint64(h.Sum(out[:0])))
}
