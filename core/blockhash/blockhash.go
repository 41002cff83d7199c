// Package blockhash defines block identity: the chained content hash that keys
// committed blocks in the radix tree and names blocks in the CP-aware
// interface, identical in every language binding.
//
// The hash of a scope is the first 8 bytes, read little-endian, of
// SHA-256("kvcm-scope-v1" ‖ 0:i64le ‖ len(salt):u32le ‖ salt) for a scope
// without a LoRA adapter, and of
// SHA-256("kvcm-scope-lora-v1" ‖ lora_id:i64le ‖ len(salt):u32le ‖ salt) for
// one with LoRA adapter lora_id, so that adapter 0 and no adapter differ. The
// key of
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
// an optional LoRA adapter id and an optional salt (for example a tenant).
// The zero Scope has neither.
type Scope struct {
	// LoRAID is the LoRA adapter id. A non-zero id is an adapter; 0 is one
	// only with HasLoRA (KVCacheManagerV2's ReuseScope(lora_id=0)), and no
	// adapter otherwise (lora_id=None).
	LoRAID int64
	// HasLoRA marks LoRAID as an adapter id, 0 included.
	HasLoRA bool
	Salt    string
}

// LoRA returns the scope of LoRA adapter id, 0 included.
func LoRA(id int64) Scope { return Scope{LoRAID: id, HasLoRA: true} }

// HasAdapter reports whether the scope names a LoRA adapter.
func (s Scope) HasAdapter() bool { return s.HasLoRA || s.LoRAID != 0 }

// Root returns the key every chain of this scope starts from.
func (s Scope) Root() Key {
	h := sha256.New()
	var b [12]byte
	domain := "kvcm-scope-v1"
	if s.HasAdapter() {
		domain = "kvcm-scope-lora-v1"
		binary.LittleEndian.PutUint64(b[:8], uint64(s.LoRAID))
	}
	binary.LittleEndian.PutUint32(b[8:], uint32(len(s.Salt)))
	h.Write([]byte(domain))
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
	x.buf = x.buf[:0]
	x.buf = binary.LittleEndian.AppendUint64(x.buf, uint64(parent))
	x.buf = binary.LittleEndian.AppendUint32(x.buf, uint32(len(tokens)))
	for _, t := range tokens {
		x.buf = binary.LittleEndian.AppendUint32(x.buf, uint32(t))
	}
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
