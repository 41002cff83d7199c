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
//
// That SHA-256 key is the default and the only one the cross-language vectors
// and other processes (the engine's own hashes, TensorRT-LLM's) agree on. A
// manager may instead key blocks with XXH3 (Algorithm XXH3): the 64-bit
// XXH3 hash, seed 0, of the same bytes, chained from the same scope hash. It
// costs a fraction of SHA-256 but is not a cryptographic hash and matches no
// other process's keys: use it only where block keys never leave the manager
// (no CP-aware peers, no consumer comparing cache events with its own hashes).
package blockhash

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"

	"github.com/zeebo/xxh3"
)

// Algorithm selects how block keys are computed from their bytes.
type Algorithm int

const (
	// SHA256 is the specified key (see the package doc), the default.
	SHA256 Algorithm = iota
	// XXH3 is the 64-bit XXH3 hash of the same bytes: faster, not
	// compatible with SHA256 keys across processes or languages.
	XXH3
)

func (a Algorithm) String() string {
	switch a {
	case SHA256:
		return "sha256"
	case XXH3:
		return "xxh3"
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

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
	h   hash.Hash // nil for XXH3
	buf []byte
	sum [sha256.Size]byte
}

// NewHasher returns a Hasher of SHA256 keys.
func NewHasher() *Hasher { return &Hasher{h: sha256.New()} }

// NewHasherFor returns a Hasher of a's keys, or an error for an unknown
// algorithm.
func NewHasherFor(a Algorithm) (*Hasher, error) {
	switch a {
	case SHA256:
		return NewHasher(), nil
	case XXH3:
		return &Hasher{}, nil
	}
	return nil, fmt.Errorf("blockhash: unknown algorithm %d", int(a))
}

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
	if x.h == nil {
		return Key(xxh3.Hash(buf))
	}
	x.h.Reset()
	x.h.Write(x.buf)
	return Key(binary.LittleEndian.Uint64(x.h.Sum(x.sum[:0])))
}

// Chain returns the SHA256 keys of the full blocks of tokens in scope.
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
