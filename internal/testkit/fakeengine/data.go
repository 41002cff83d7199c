package fakeengine

import (
	"encoding/binary"

	"github.com/kvcm/kvcm/core/config"
)

// The fake model. Everything here is a pure function of its arguments, so two
// engines with the same seed agree on every byte.
//
// The KV of position p depends on the whole prefix tokens[0..p] through a
// chained per-token hash, like the KV of real attention layers: changing any
// earlier token changes every later position's bytes.

const golden = 0x9e3779b97f4a7c15

// mix64 is the splitmix64 finalizer: a bijective 64-bit mixer.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// chainStart is the prefix hash before any token.
func chainStart(seed uint64) uint64 { return mix64(seed ^ 0x6b76636d2d66616b) } // "kvcm-fak"

// chainNext extends the prefix hash h by token t.
func chainNext(h uint64, t config.Token) uint64 {
	return mix64(h + golden + uint64(uint32(t))*0xd6e8feb86659fd93)
}

// appendPrefixHashes appends to dst the prefix hash of tokens[0..p] for every p
// from len(dst) to len(tokens)-1, continuing the chain from dst's last entry.
func appendPrefixHashes(dst []uint64, seed uint64, tokens []config.Token) []uint64 {
	h := chainStart(seed)
	if n := len(dst); n > 0 {
		h = dst[n-1]
	}
	for p := len(dst); p < len(tokens); p++ {
		h = chainNext(h, tokens[p])
		dst = append(dst, h)
	}
	return dst
}

// bufferSalt identifies one buffer (layer, role) in the data stream.
func bufferSalt(layer int32, role config.DataRole) uint64 {
	// FNV-1a of the role, then mixed with the layer.
	r := uint64(0xcbf29ce484222325)
	for i := 0; i < len(role); i++ {
		r ^= uint64(role[i])
		r *= 0x100000001b3
	}
	return mix64(uint64(uint32(layer))<<32 ^ r ^ golden)
}

// lowByteMask clears the low (even-offset) byte of every 16-bit little-endian
// element of a 64-bit word.
const lowByteMask = 0xff00ff00ff00ff00

// fillToken writes the KV bytes of one position of one buffer into dst.
// prefix is the prefix hash of tokens[0..pos]; salt the buffer's salt.
func fillToken(dst []byte, prefix uint64, pos int, salt uint64, zeroLow bool) {
	x := mix64(prefix ^ mix64(uint64(pos)+golden) ^ salt)
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		x += golden
		v := mix64(x)
		if zeroLow {
			v &= lowByteMask
		}
		binary.LittleEndian.PutUint64(dst[i:], v)
	}
	if i < len(dst) {
		x += golden
		v := mix64(x)
		if zeroLow {
			v &= lowByteMask
		}
		for ; i < len(dst); i++ {
			dst[i] = byte(v)
			v >>= 8
		}
	}
}

// nextToken is the fake model's prediction after a prefix whose hash is h.
func nextToken(h uint64, vocab int) config.Token {
	return config.Token(mix64(h^0x6e657874746f6b6e) % uint64(vocab)) // "nexttokn"
}
