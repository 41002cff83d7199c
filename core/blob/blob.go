// Package blob is the format of one cold page as the persistent disk tier and
// the shared tier store it: a small header followed by the codec's payload.
//
// A blob is content-addressed. Its header names the layout it was encoded
// for (a Fingerprint: what makes blobs of two managers interchangeable), the
// lifecycle, the block key and what rebuilding the block's chain needs (the
// parent key and the block's tokens), and carries a CRC-32C (Castagnoli,
// hardware-accelerated) of the payload and of itself. A reader that finds a
// damaged, truncated or foreign blob treats it as a miss, never as data.
//
// The package knows nothing about files, slots or network: it encodes,
// decodes and verifies bytes.
//
// Layout (little endian), HeaderSize(n) bytes for a block of n tokens:
//
//	off  size  field
//	  0     4  magic "KVCB"
//	  4     2  Version
//	  6     2  flags (FlagDigests, or 0)
//	  8     4  lifecycle
//	 12     4  n, the number of tokens
//	 16    16  fingerprint
//	 32     8  block key
//	 40     8  parent key
//	 48     8  writer tag (opaque to readers; 0 when unused)
//	 56     8  payload length
//	 64     4  payload CRC-32C
//	 68     4  reserved (0)
//	 72  4×n   tokens (int32)
//	72+4n   4  CRC-32C of bytes [0, 72+4n)
//
// A header with FlagDigests (a block with multimodal digest tokens,
// HeaderSizeDigests(n, d) bytes) holds d (uint32, 1 ≤ d ≤ n) after the
// tokens, then d digests of 36 bytes (position in the block, uint32; the
// 32-byte digest) by ascending position, and the CRC-32C last, of every byte
// before it. A reader of the format before digests finds that checksum
// wrong: such a blob is a miss for it, never another block.
package blob

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Version is the format version this package writes and reads.
const Version = 1

const (
	magic     = "KVCB"
	fixedSize = 72
)

// ErrCorrupt: the bytes are not an intact blob of this format (bad magic,
// header checksum, payload length or payload checksum).
var ErrCorrupt = errors.New("blob corrupt")

// ErrVersion: the blob has another format version.
var ErrVersion = errors.New("blob format version mismatch")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C of b, as the header stores it.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// FlagDigests marks a header holding digest tokens.
const FlagDigests = 1

// digestSize is the encoded size of one digest token.
const digestSize = 4 + 32

// HeaderSize is the size of the header of a blob of a block of tokens tokens
// without digests.
func HeaderSize(tokens int) int { return fixedSize + 4*tokens + 4 }

// HeaderSizeDigests is the size of the header of a blob of a block of tokens
// tokens of which digests are digest tokens (HeaderSize without any).
func HeaderSizeDigests(tokens, digests int) int {
	if digests == 0 {
		return HeaderSize(tokens)
	}
	return HeaderSize(tokens) + 4 + digestSize*digests
}

// Digest is a digest token of a block: its position in the block and the
// multimodal item's 32-byte content digest.
type Digest struct {
	Pos   int32
	Value [32]byte
}

// Fingerprint identifies a layout: blobs with equal fingerprints are
// interchangeable between managers.
type Fingerprint [16]byte

func (f Fingerprint) String() string { return fmt.Sprintf("%x", f[:]) }

// Buffer is one buffer of a lifecycle, in the order the codec sees it.
type Buffer struct {
	Layer int32
	Role  string
	Bytes int64
}

// Layout is what makes blobs of one lifecycle interchangeable.
type Layout struct {
	// BlobBytes is the payload size.
	BlobBytes int64
	// TokensPerBlock is the manager's block size.
	TokensPerBlock int
	// Window and Sinks are the lifecycle's attention window and sink tokens.
	Window, Sinks int
	// Buffers are the lifecycle's buffers, pool by pool, in order.
	Buffers []Buffer
	// Codec is the codec's identity and version (see codec.Identifier).
	Codec string
}

// Fingerprint hashes every field of l (SHA-256, truncated).
func (l Layout) Fingerprint() Fingerprint {
	h := sha256.New()
	var b []byte
	b = append(b, "kvcm blob layout v1\x00"...)
	b = binary.LittleEndian.AppendUint64(b, uint64(l.BlobBytes))
	b = binary.LittleEndian.AppendUint64(b, uint64(l.TokensPerBlock))
	b = binary.LittleEndian.AppendUint64(b, uint64(l.Window))
	b = binary.LittleEndian.AppendUint64(b, uint64(l.Sinks))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(l.Buffers)))
	for _, buf := range l.Buffers {
		b = binary.LittleEndian.AppendUint32(b, uint32(buf.Layer))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(buf.Role)))
		b = append(b, buf.Role...)
		b = binary.LittleEndian.AppendUint64(b, uint64(buf.Bytes))
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(len(l.Codec)))
	b = append(b, l.Codec...)
	h.Write(b)
	var f Fingerprint
	copy(f[:], h.Sum(nil))
	return f
}

// Header is the decoded header of a blob.
type Header struct {
	Fingerprint Fingerprint
	LifeCycle   uint32
	Key, Parent uint64
	// Tag is the writer's own: a slot-addressed writer stores a per-write
	// sequence number to tell the blob it wrote from an older one.
	Tag        uint64
	PayloadLen int64
	PayloadCRC uint32
	Tokens     []int32
	// Digests are the block's digest tokens by ascending position (their
	// Tokens are 0); nil for a text block.
	Digests []Digest
}

// Size is the encoded size of h.
func (h *Header) Size() int { return HeaderSizeDigests(len(h.Tokens), len(h.Digests)) }

// Seal sets the payload length and checksum of h from payload.
func (h *Header) Seal(payload []byte) {
	h.PayloadLen = int64(len(payload))
	h.PayloadCRC = Checksum(payload)
}

// Put encodes h into dst, which must hold h.Size() bytes, and returns the
// bytes written.
func (h *Header) Put(dst []byte) (int, error) {
	n := h.Size()
	if len(dst) < n {
		return 0, fmt.Errorf("blob header needs %d bytes, got %d", n, len(dst))
	}
	le := binary.LittleEndian
	copy(dst, magic)
	le.PutUint16(dst[4:], Version)
	var flags uint16
	if len(h.Digests) > 0 {
		flags = FlagDigests
	}
	le.PutUint16(dst[6:], flags)
	le.PutUint32(dst[8:], h.LifeCycle)
	le.PutUint32(dst[12:], uint32(len(h.Tokens)))
	copy(dst[16:32], h.Fingerprint[:])
	le.PutUint64(dst[32:], h.Key)
	le.PutUint64(dst[40:], h.Parent)
	le.PutUint64(dst[48:], h.Tag)
	le.PutUint64(dst[56:], uint64(h.PayloadLen))
	le.PutUint32(dst[64:], h.PayloadCRC)
	le.PutUint32(dst[68:], 0)
	for i, t := range h.Tokens {
		le.PutUint32(dst[fixedSize+4*i:], uint32(t))
	}
	if len(h.Digests) > 0 {
		off := fixedSize + 4*len(h.Tokens)
		le.PutUint32(dst[off:], uint32(len(h.Digests)))
		off += 4
		for _, d := range h.Digests {
			le.PutUint32(dst[off:], uint32(d.Pos))
			copy(dst[off+4:off+digestSize], d.Value[:])
			off += digestSize
		}
	}
	le.PutUint32(dst[n-4:], Checksum(dst[:n-4]))
	return n, nil
}

// Decode parses the header at the start of src, checking its magic, version
// and checksum. maxTokens bounds the token count a reader accepts (its
// tokens per block), so a damaged count cannot make it read far.
func Decode(src []byte, maxTokens int) (Header, error) {
	le := binary.LittleEndian
	if len(src) < fixedSize+4 {
		return Header{}, fmt.Errorf("%w: %d bytes, less than a header", ErrCorrupt, len(src))
	}
	if string(src[:4]) != magic {
		return Header{}, fmt.Errorf("%w: bad magic %q", ErrCorrupt, src[:4])
	}
	if v := le.Uint16(src[4:]); v != Version {
		return Header{}, fmt.Errorf("%w: version %d, want %d", ErrVersion, v, Version)
	}
	nt := le.Uint32(src[12:])
	if int64(nt) > int64(maxTokens) {
		return Header{}, fmt.Errorf("%w: %d tokens, at most %d", ErrCorrupt, nt, maxTokens)
	}
	flags := le.Uint16(src[6:])
	if flags&^FlagDigests != 0 {
		return Header{}, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	n := HeaderSize(int(nt))
	nd := 0
	if flags&FlagDigests != 0 {
		if len(src) < n+4 {
			return Header{}, fmt.Errorf("%w: header of at least %d bytes, got %d", ErrCorrupt, n+4, len(src))
		}
		d := le.Uint32(src[n-4:]) // the digest count, where a text header's checksum is
		if d == 0 || d > nt {
			return Header{}, fmt.Errorf("%w: %d digests in a block of %d tokens", ErrCorrupt, d, nt)
		}
		nd = int(d)
		n = HeaderSizeDigests(int(nt), nd)
	}
	if len(src) < n {
		return Header{}, fmt.Errorf("%w: header of %d bytes, got %d", ErrCorrupt, n, len(src))
	}
	if got, want := Checksum(src[:n-4]), le.Uint32(src[n-4:]); got != want {
		return Header{}, fmt.Errorf("%w: header checksum %08x, stored %08x", ErrCorrupt, got, want)
	}
	h := Header{
		LifeCycle:  le.Uint32(src[8:]),
		Key:        le.Uint64(src[32:]),
		Parent:     le.Uint64(src[40:]),
		Tag:        le.Uint64(src[48:]),
		PayloadLen: int64(le.Uint64(src[56:])),
		PayloadCRC: le.Uint32(src[64:]),
		Tokens:     make([]int32, nt),
	}
	copy(h.Fingerprint[:], src[16:32])
	for i := range h.Tokens {
		h.Tokens[i] = int32(le.Uint32(src[fixedSize+4*i:]))
	}
	if nd > 0 {
		h.Digests = make([]Digest, nd)
		off := fixedSize + 4*int(nt) + 4
		for i := range h.Digests {
			d := &h.Digests[i]
			d.Pos = int32(le.Uint32(src[off:]))
			copy(d.Value[:], src[off+4:off+digestSize])
			if d.Pos < 0 || int64(d.Pos) >= int64(nt) || (i > 0 && d.Pos <= h.Digests[i-1].Pos) {
				return Header{}, fmt.Errorf("%w: digest %d at position %d", ErrCorrupt, i, d.Pos)
			}
			off += digestSize
		}
	}
	return h, nil
}

// Verify checks payload against the length and checksum h stores.
func (h *Header) Verify(payload []byte) error {
	if int64(len(payload)) != h.PayloadLen {
		return fmt.Errorf("%w: payload of %d bytes, header says %d", ErrCorrupt, len(payload), h.PayloadLen)
	}
	if got := Checksum(payload); got != h.PayloadCRC {
		return fmt.Errorf("%w: payload checksum %08x, stored %08x", ErrCorrupt, got, h.PayloadCRC)
	}
	return nil
}
