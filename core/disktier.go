package core

import (
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// The disk tier stores each cold page as a core/blob blob: a header of
// blob.HeaderSize(tokens per block) bytes, then the codec's payload. Slot s of
// a disk group sits at s × (header + payload). The header names the page's
// layout fingerprint, lifecycle, block key, parent key and tokens, a writer
// tag (unique per write, so a slot still holding an older blob is told from
// the one the manager wrote) and the payload's checksum. Every read checks
// them: a damaged, truncated, stale or foreign blob fails the read like an
// I/O error (ErrIO wrapping blob.ErrCorrupt), which loses the pages of the
// transaction (ErrDataLost for their caches) and never delivers its bytes.

// initBlobFormat computes every lifecycle's layout fingerprint. A codec
// without an identity gets fingerprints no other manager shares.
func (m *Manager) initBlobFormat() error {
	id, ok := codec.IdentityOf(m.codec)
	if !ok {
		var nonce [16]byte
		rand.Read(nonce[:])
		id = fmt.Sprintf("anonymous %x", nonce)
		if t, on := m.cfg.Tier(config.DiskTier); on && t.Persistent {
			return &config.Error{Field: fmt.Sprintf("cache_tiers[%d].persistent", len(m.cfg.CacheTiers)-1),
				Msg: "needs a codec with an identity (codec.Identifier), so blobs of another format are never read as this one's"}
		}
	}
	m.blobFP = make([]blob.Fingerprint, len(m.lt.LifeCycles))
	for i := range m.lt.LifeCycles {
		lc := &m.lt.LifeCycles[i]
		l := blob.Layout{
			BlobBytes:      m.lcCodec[i].coldBytes,
			TokensPerBlock: m.cfg.TokensPerBlock,
			Window:         lc.Window.Size,
			Sinks:          lc.Window.Sinks,
			Codec:          id,
		}
		for _, p := range lc.Pools {
			for _, b := range p.Buffers {
				l.Buffers = append(l.Buffers, blob.Buffer{Layer: b.Layer, Role: string(b.Role), Bytes: p.BufferBytes})
			}
		}
		if lc.Window.SSM {
			l.Window = -1 // an SSM state is no attention window's page
		}
		m.blobFP[i] = l.Fingerprint()
	}
	return nil
}

// blobHeader is the header the disk tier writes for p with tag; the payload
// fields are set by Seal when the payload is ready.
func (m *Manager) blobHeader(p *page, tag uint64) blob.Header {
	h := blob.Header{Fingerprint: m.blobFP[p.lc], LifeCycle: uint32(p.lc), Tag: tag}
	if n := p.node; n != nil {
		h.Key = uint64(n.key)
		if par := m.parentOf(n); par != nil {
			h.Parent = uint64(par.key)
		}
		h.Tokens = append([]int32(nil), m.tokensOf(n)...) // the node may go before the write runs
	}
	return h
}

// blobWant is what a read expects of the blob in a slot.
type blobWant struct {
	fp  blob.Fingerprint
	lc  layout.LayerGroupID
	tag uint64
}

func (m *Manager) wantOf(p *page) blobWant {
	return blobWant{fp: m.blobFP[p.lc], lc: p.lc, tag: p.diskTag}
}

// diskQueueDepth is the most blob reads or writes one disk transaction keeps
// in flight: a bounded pool of workers, so the device sees a queue rather
// than one blob at a time.
const diskQueueDepth = 8

// diskIO does the blob I/O of one disk group, from host functions of the
// disk streams (several at once); its aligned scratch slot buffers are
// pooled across transactions.
type diskIO struct {
	file     DiskFile
	hdrBytes int64
	blob     int64 // payload bytes
	stride   int64 // header, payload, padding to align
	align    int64
	tokens   int // tokens per block: the most a header may hold
	scratch  sync.Pool
}

func (g *slotGroup) io(tokensPerBlock int) *diskIO {
	return &diskIO{file: g.file, hdrBytes: g.hdrBytes, blob: g.blobBytes(), stride: g.stride, align: g.align, tokens: tokensPerBlock}
}

// alignedBuf returns n bytes whose address is a multiple of align.
func alignedBuf(n, align int64) []byte {
	b := make([]byte, n+align)
	off := int64(0)
	if r := int64(uintptr(unsafe.Pointer(&b[0]))) % align; r != 0 {
		off = align - r
	}
	return b[off : off+n : off+n]
}

// each runs fn for 0 ≤ i < n on up to diskQueueDepth workers, each with its
// own scratch slot buffer, and returns the first error (the others still
// finish what they started, so nothing runs after each returns).
func (d *diskIO) each(n int, fn func(i int, scratch []byte) error) error {
	workers := min(n, diskQueueDepth)
	if workers <= 1 {
		buf := d.getScratch()
		defer d.scratch.Put(buf)
		for i := range n {
			if err := fn(i, *buf); err != nil {
				return err
			}
		}
		return nil
	}
	var next atomic.Int64
	var failed atomic.Bool
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := d.getScratch()
			defer d.scratch.Put(buf)
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i, *buf); err != nil {
					errs[w] = err
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (d *diskIO) getScratch() *[]byte {
	if b, ok := d.scratch.Get().(*[]byte); ok {
		return b
	}
	b := alignedBuf(d.stride, d.align)
	return &b
}

// write stores payload with header h in slot s, through scratch.
func (d *diskIO) write(s int32, h *blob.Header, payload, scratch []byte) error {
	buf := scratch[:d.stride]
	h.Seal(payload)
	if _, err := h.Put(buf[:d.hdrBytes]); err != nil {
		return err
	}
	copy(buf[d.hdrBytes:], payload)
	if _, err := d.file.WriteAt(buf, int64(s)*d.stride); err != nil {
		return fmt.Errorf("%w: disk write of slot %d: %w", ErrIO, s, err)
	}
	return nil
}

// read loads the blob of slot s through scratch, checks it against want, and
// copies its payload to dst.
func (d *diskIO) read(s int32, want blobWant, dst, scratch []byte) error {
	buf := scratch[:d.stride]
	if _, err := d.file.ReadAt(buf, int64(s)*d.stride); err != nil {
		return fmt.Errorf("%w: disk read of slot %d: %w", ErrIO, s, err)
	}
	if _, err := d.check(buf, want); err != nil {
		return fmt.Errorf("%w: disk read of slot %d: %w", ErrIO, s, err)
	}
	copy(dst, d.payload(buf))
	return nil
}

// check verifies the blob in buf against want.
func (d *diskIO) check(buf []byte, want blobWant) (blob.Header, error) {
	h, err := blob.Decode(buf[:d.hdrBytes], d.tokens)
	switch {
	case err != nil:
		return h, err
	case h.Fingerprint != want.fp || h.LifeCycle != uint32(want.lc):
		return h, fmt.Errorf("%w: blob of layout %v lifecycle %d, want %v lifecycle %d",
			blob.ErrCorrupt, h.Fingerprint, h.LifeCycle, want.fp, want.lc)
	case h.Tag != want.tag:
		return h, fmt.Errorf("%w: blob written as %d, want %d (stale slot)", blob.ErrCorrupt, h.Tag, want.tag)
	}
	return h, h.Verify(d.payload(buf))
}

func (d *diskIO) payload(slot []byte) []byte { return slot[d.hdrBytes : d.hdrBytes+d.blob] }
