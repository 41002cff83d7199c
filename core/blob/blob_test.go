package blob

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sample() (Header, []byte) {
	payload := make([]byte, 4096)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	h := Header{
		Fingerprint: Layout{BlobBytes: 4096, TokensPerBlock: 4, Codec: "test/1"}.Fingerprint(),
		LifeCycle:   2, Key: 0x1234, Parent: 0x99, Tag: 7, Tokens: []int32{1, 2, 3, 4},
	}
	h.Seal(payload)
	return h, payload
}

// A header decodes to what was encoded, and its payload verifies.
func TestHeaderRoundTrips(t *testing.T) {
	h, payload := sample()
	buf := make([]byte, HeaderSize(4))
	n, err := h.Put(buf)
	require.NoError(t, err)
	assert.Equal(t, len(buf), n)
	got, err := Decode(buf, 4)
	require.NoError(t, err)
	assert.Equal(t, h, got)
	assert.NoError(t, got.Verify(payload))
}

// Every single flipped bit of header or payload is detected: a damaged blob
// never passes as data.
func TestEveryBitFlipIsDetected(t *testing.T) {
	h, payload := sample()
	blob := make([]byte, HeaderSize(4)+len(payload))
	_, err := h.Put(blob)
	require.NoError(t, err)
	copy(blob[HeaderSize(4):], payload)
	for bit := range 8 * len(blob) {
		blob[bit/8] ^= 1 << (bit % 8)
		got, err := Decode(blob[:HeaderSize(4)], 4)
		if err == nil {
			err = got.Verify(blob[HeaderSize(4):])
		}
		assert.Error(t, err, "bit %d", bit)
		blob[bit/8] ^= 1 << (bit % 8)
	}
}

// Zeros (a truncated file extended again), a foreign version and a payload
// of another length are rejected.
func TestZerosVersionAndLengthAreRejected(t *testing.T) {
	_, err := Decode(make([]byte, HeaderSize(4)), 4)
	assert.ErrorIs(t, err, ErrCorrupt)

	h, payload := sample()
	buf := make([]byte, HeaderSize(4))
	_, err = h.Put(buf)
	require.NoError(t, err)
	buf[4] = 2
	_, err = Decode(buf, 4)
	assert.ErrorIs(t, err, ErrVersion)

	assert.ErrorIs(t, h.Verify(payload[:100]), ErrCorrupt)
	_, err = Decode(buf, 3)
	assert.Error(t, err, "more tokens than the reader's block holds")
}

// The fingerprint changes with every field that makes blobs incompatible.
func TestFingerprintCoversTheLayout(t *testing.T) {
	base := Layout{BlobBytes: 4096, TokensPerBlock: 16, Window: 0, Sinks: 0,
		Buffers: []Buffer{{Layer: 0, Role: "key", Bytes: 2048}, {Layer: 0, Role: "value", Bytes: 2048}}, Codec: "c/1"}
	variants := []func(l *Layout){
		func(l *Layout) { l.BlobBytes++ },
		func(l *Layout) { l.TokensPerBlock++ },
		func(l *Layout) { l.Window = 128 },
		func(l *Layout) { l.Sinks = 4 },
		func(l *Layout) { l.Buffers[0], l.Buffers[1] = l.Buffers[1], l.Buffers[0] },
		func(l *Layout) { l.Buffers[1].Layer = 1 },
		func(l *Layout) { l.Codec = "c/2" },
	}
	seen := map[Fingerprint]int{base.Fingerprint(): -1}
	for i, v := range variants {
		l := base
		l.Buffers = append([]Buffer(nil), base.Buffers...)
		v(&l)
		f := l.Fingerprint()
		_, dup := seen[f]
		assert.False(t, dup, "variant %d", i)
		seen[f] = i
	}
}

// BenchmarkChecksum is the CRC-32C cost per blob size; compare its GB/s with
// the disk's (kvcm bench disk prints both).
func BenchmarkChecksum(b *testing.B) {
	for _, size := range []int{16 << 10, 256 << 10, 2 << 20} {
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = byte(rand.Uint32())
		}
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for range b.N {
				Checksum(buf)
			}
		})
	}
}

// A header with digest tokens round-trips them (FlagDigests set, the
// larger size), and every flipped bit of it is detected.
func TestDigestHeaderRoundTripsAndDetectsBitFlips(t *testing.T) {
	h, payload := sample()
	h.Tokens = []int32{1, 0, 0, 4}
	h.Digests = []Digest{{Pos: 1, Value: [32]byte{1, 2, 3}}, {Pos: 2, Value: [32]byte{9}}}
	n := HeaderSizeDigests(4, 2)
	assert.Equal(t, HeaderSize(4)+4+2*36, n)
	assert.Equal(t, n, h.Size())
	buf := make([]byte, n)
	_, err := h.Put(buf)
	require.NoError(t, err)
	assert.Equal(t, uint16(FlagDigests), uint16(buf[6])|uint16(buf[7])<<8)
	got, err := Decode(buf, 4)
	require.NoError(t, err)
	assert.Equal(t, h, got)
	require.NoError(t, got.Verify(payload))
	for bit := range 8 * n {
		buf[bit/8] ^= 1 << (bit % 8)
		_, err := Decode(buf, 4)
		assert.Error(t, err, "bit %d", bit)
		buf[bit/8] ^= 1 << (bit % 8)
	}
	text, _ := sample()
	assert.Equal(t, HeaderSize(4), text.Size(), "a text block's header keeps its size")
}

// A digest header whose digests are out of order or out of the block is
// corrupt, even with a valid checksum.
func TestDigestHeaderOutOfOrderIsCorrupt(t *testing.T) {
	h, _ := sample()
	h.Digests = []Digest{{Pos: 2}, {Pos: 1}}
	buf := make([]byte, h.Size())
	_, err := h.Put(buf)
	require.NoError(t, err)
	_, err = Decode(buf, 4)
	require.ErrorIs(t, err, ErrCorrupt)
	h.Digests = []Digest{{Pos: 4}}
	buf = make([]byte, h.Size())
	_, err = h.Put(buf)
	require.NoError(t, err)
	_, err = Decode(buf, 4)
	require.ErrorIs(t, err, ErrCorrupt)
}
