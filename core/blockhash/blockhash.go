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
// A block may hold multimodal tokens: a token that is the 32-byte content
// digest of a multimodal item (KVCacheManagerV2's bytes and MmItemContext
// tokens; an item's uuid never enters the key). The key of a block with at
// least one digest is the first 8 bytes, little-endian, of
// SHA-256(parent:u64le ‖ (n | 1<<31):u32le ‖ e_0 ‖ … ‖ e_{n-1}), where e_i is
// 0x00 ‖ token_i:i32le for a text token and 0x01 ‖ the 32 digest bytes for
// a digest. The flag bit keeps these keys apart from text blocks (n < 2^31),
// whose keys, and the text-only path that computes them, are unchanged.
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
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"slices"

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

// DigestSize is the size of a multimodal digest token.
const DigestSize = 32

// Digest is a multimodal item's content digest, a token of its own.
type Digest [DigestSize]byte

// DigestAt is a digest token at position Pos of a token sequence; the
// sequence's token at Pos is not text (its value is ignored). A sequence's
// digests are sorted by Pos, each Pos once.
type DigestAt struct {
	Pos    int
	Digest Digest
}

// digestFlag marks the token count of a block with digests.
const digestFlag = 1 << 31

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

// zeroRoot is the zero Scope's root, the one nearly every cache starts
// from: computed once rather than hashed at every lookup.
var zeroRoot = Scope{}.hashRoot()

// Root returns the key every chain of this scope starts from.
func (s Scope) Root() Key {
	if s == (Scope{}) {
		return zeroRoot
	}
	return s.hashRoot()
}

func (s Scope) hashRoot() Key {
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

// NextDigests is Next for a block with digest tokens: digests are the
// block's, their positions relative to the block's first token. Without
// digests it is Next.
func (x *Hasher) NextDigests(parent Key, tokens []int32, digests []DigestAt) Key {
	if len(digests) == 0 {
		return x.Next(parent, tokens)
	}
	n := 12 + 5*len(tokens) + (DigestSize-4)*len(digests)
	if cap(x.buf) < n {
		x.buf = make([]byte, n)
	}
	buf := x.buf[:0]
	buf = binary.LittleEndian.AppendUint64(buf, uint64(parent))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(tokens))|digestFlag)
	d := 0
	for i, t := range tokens {
		if d < len(digests) && digests[d].Pos == i {
			buf = append(buf, 1)
			buf = append(buf, digests[d].Digest[:]...)
			d++
			continue
		}
		buf = append(buf, 0)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
	}
	x.buf = buf
	if x.h == nil {
		return Key(xxh3.Hash(buf))
	}
	x.h.Reset()
	x.h.Write(buf)
	return Key(binary.LittleEndian.Uint64(x.h.Sum(x.sum[:0])))
}

// CheckDigests reports an error naming name when digests are not sorted by
// position, repeat one, or lie outside a sequence of n tokens.
func CheckDigests(name string, digests []DigestAt, n int) error {
	for i, d := range digests {
		if d.Pos < 0 || d.Pos >= n {
			return fmt.Errorf("%s[%d]: position %d outside the %d tokens", name, i, d.Pos, n)
		}
		if i > 0 && d.Pos <= digests[i-1].Pos {
			return fmt.Errorf("%s[%d]: position %d does not follow %d (sorted, each once)", name, i, d.Pos, digests[i-1].Pos)
		}
	}
	return nil
}

// DigestsIn returns the digests of [from, to) of a sequence, their positions
// relative to from; digests must be sorted by position.
func DigestsIn(digests []DigestAt, from, to int) []DigestAt {
	if len(digests) == 0 {
		return nil // text: asked once per block of every lookup and commit
	}
	lo, _ := slices.BinarySearchFunc(digests, from, func(d DigestAt, p int) int { return cmp.Compare(d.Pos, p) })
	hi, _ := slices.BinarySearchFunc(digests, to, func(d DigestAt, p int) int { return cmp.Compare(d.Pos, p) })
	if lo == hi {
		return nil
	}
	out := make([]DigestAt, hi-lo)
	for i, d := range digests[lo:hi] {
		out[i] = DigestAt{Pos: d.Pos - from, Digest: d.Digest}
	}
	return out
}

// ChainDigests returns the keys of a's blocks of tokens in scope, digests
// included: one per full block and, with partial, one more for a trailing
// partial block (KVCacheManagerV2's sequence_to_blockchain_keys, less its
// root pair: the root is scope.Root()).
func ChainDigests(a Algorithm, scope Scope, tokensPerBlock int, tokens []int32, digests []DigestAt, partial bool) ([]Key, error) {
	if tokensPerBlock <= 0 {
		return nil, fmt.Errorf("tokens_per_block: must be positive, got %d", tokensPerBlock)
	}
	if err := CheckDigests("digest_positions", digests, len(tokens)); err != nil {
		return nil, err
	}
	x, err := NewHasherFor(a)
	if err != nil {
		return nil, err
	}
	var keys []Key
	k := scope.Root()
	for i := 0; i < len(tokens); i += tokensPerBlock {
		end := i + tokensPerBlock
		if end > len(tokens) {
			if !partial {
				break
			}
			end = len(tokens)
		}
		k = x.NextDigests(k, tokens[i:end], DigestsIn(digests, i, end))
		keys = append(keys, k)
	}
	return keys, nil
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
