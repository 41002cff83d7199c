package core

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// The disk tier stores each cold page as a core/blob blob: a header of
// blob.HeaderSize(tokens per block) bytes, padded to the group's payload
// offset (a 4 KiB block under direct I/O), then the codec's payload, padded
// to the slot stride; slot s of a disk group sits at s × stride. The header
// names the page's layout fingerprint, lifecycle, block key, parent key and
// tokens, a writer tag (unique per write, so a slot still holding an older
// blob is told from the one the manager wrote) and the payload's checksum.
// Every read checks them: a damaged, truncated, stale or foreign blob fails
// like an I/O error (ErrIO wrapping blob.ErrCorrupt) and loses only its own
// page (see diskBatch and inflight.blobErr): its bytes are never delivered,
// the cache holding it sees the failure on its stream after Resume
// (checkBlobs) and ErrDataLost on its next call.

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

// diskQueueDepth is how many disk I/O workers a manager runs: the most
// vectored reads or writes it keeps in flight, so the device sees a queue
// rather than one blob at a time.
const diskQueueDepth = 8

// diskRunBytes caps the bytes one vectored read or write covers: a run of
// consecutive slots of one transaction is moved in calls of up to this size,
// so small blobs reach the disk as large aligned I/O.
const diskRunBytes = 1 << 20

// diskQueue is the manager's pool of disk I/O workers. Jobs are pushed from
// host functions of the disk streams, which must not block (on CUDA they may
// share one driver thread with every other stream's host functions), so the
// queue is unbounded; a transaction's stream waits for its jobs with
// waitHost, not inside a host function.
type diskQueue struct {
	mu     sync.Mutex
	cond   sync.Cond
	jobs   []func()
	closed bool
	wg     sync.WaitGroup
}

func newDiskQueue(workers int) *diskQueue {
	q := &diskQueue{}
	q.cond.L = &q.mu
	for range workers {
		q.wg.Add(1)
		go q.work()
	}
	return q
}

func (q *diskQueue) work() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		for len(q.jobs) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.jobs) == 0 {
			q.mu.Unlock()
			return
		}
		job := q.jobs[0]
		q.jobs[0] = nil
		q.jobs = q.jobs[1:]
		q.mu.Unlock()
		job()
	}
}

// push queues jobs; it never blocks.
func (q *diskQueue) push(jobs []func()) {
	q.mu.Lock()
	q.jobs = append(q.jobs, jobs...)
	q.mu.Unlock()
	q.cond.Broadcast()
}

// close lets the workers finish the queued jobs and waits for them.
func (q *diskQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
	q.wg.Wait()
}

// diskBatch is the blob I/O of one transaction: its jobs, and the outcome of
// each blob. A blob that cannot be read, fails its check, or cannot be
// written fails only itself (see inflight.blobErr): the transaction's other
// pages still move. done closes when the last job has finished.
type diskBatch struct {
	mu   sync.Mutex
	bad  []error // by move
	left int
	done chan struct{}
}

func newDiskBatch(moves int) *diskBatch {
	return &diskBatch{bad: make([]error, moves), done: make(chan struct{})}
}

func (b *diskBatch) fail(i int, err error) {
	b.mu.Lock()
	if b.bad[i] == nil {
		b.bad[i] = err
	}
	b.mu.Unlock()
}

// finish ends one job.
func (b *diskBatch) finish() {
	b.mu.Lock()
	b.left--
	last := b.left == 0
	b.mu.Unlock()
	if last {
		close(b.done)
	}
}

// err is the failure of move i's blob, if any.
func (b *diskBatch) err(i int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bad[i]
}

// blobOp is one blob of a transaction: move i's slot and its payload bytes
// in host memory (pinned staging or a host-tier slot); hdr is the header a
// write stores, want what a read expects.
type blobOp struct {
	i    int
	slot int32
	buf  []byte
	hdr  *blob.Header
	want blobWant
}

// diskIO does the blob I/O of one disk group, on the manager's disk
// workers. A slot is the blob's header, padded to payOff (an aligned offset
// under direct I/O), then the payload, padded to stride. Payloads are read
// and written in place, as iovecs of one vectored call per run of
// consecutive slots; only a payload whose address or length is not aligned
// for direct I/O goes through a copy.
type diskIO struct {
	file     DiskFile
	hdrBytes int64
	payOff   int64 // payload offset within a slot
	blob     int64 // payload bytes
	stride   int64 // header, payload, padding to align
	align    int64
	tokens   int // tokens per block: the most a header may hold
	runSlots int // the most slots one vectored call covers
	scratch  sync.Pool
}

func (g *slotGroup) io(tokensPerBlock int) *diskIO {
	return &diskIO{file: g.file, hdrBytes: g.hdrBytes, payOff: g.payOff, blob: g.blobBytes(), stride: g.stride,
		align: g.align, tokens: tokensPerBlock, runSlots: int(max(1, min(diskRunBytes/g.stride, maxIOV/3)))}
}

// maxIOV is the most iovecs one vectored call takes (Linux's IOV_MAX).
const maxIOV = 1024

// alignedBuf returns n bytes whose address is a multiple of align.
func alignedBuf(n, align int64) []byte {
	b := make([]byte, n+align)
	off := int64(0)
	if r := int64(uintptr(unsafe.Pointer(&b[0]))) % align; r != 0 {
		off = align - r
	}
	return b[off : off+n : off+n]
}

// ioScratch is one job's buffers: the header block of every slot of a run
// (zero padded to payOff) and, for payloads that cannot be moved in place,
// the rest of each slot.
type ioScratch struct {
	hdr  []byte
	tail []byte
	iov  [][]byte
}

func (d *diskIO) getScratch() *ioScratch {
	if s, ok := d.scratch.Get().(*ioScratch); ok {
		return s
	}
	return &ioScratch{hdr: alignedBuf(int64(d.runSlots)*d.payOff, d.align)}
}

// tailBuf is room k of the scratch's tails: the stride − payOff bytes of a
// slot after its header block.
func (d *diskIO) tailBuf(s *ioScratch, k int) []byte {
	n := d.stride - d.payOff
	if int64(len(s.tail)) < int64(d.runSlots)*n {
		s.tail = alignedBuf(int64(d.runSlots)*n, d.align)
	}
	return s.tail[int64(k)*n : int64(k+1)*n]
}

// inPlace is how many leading payload bytes of buf the I/O moves in place:
// all of them when the file is not direct, else the aligned part of an
// aligned buffer (none of an unaligned one).
func (d *diskIO) inPlace(buf []byte) int64 {
	if d.align == 1 {
		return int64(len(buf))
	}
	if int64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))%d.align != 0 {
		return 0
	}
	return int64(len(buf)) / d.align * d.align
}

// jobs splits ops into runs of consecutive slots and returns one job per run
// for the disk workers (write: store the blobs; else load and check them).
// Every job ends with b.finish; b.left counts them.
func (d *diskIO) jobs(ops []blobOp, write bool, b *diskBatch) []func() {
	slices.SortFunc(ops, func(x, y blobOp) int { return int(x.slot) - int(y.slot) })
	var out []func()
	for len(ops) > 0 {
		n := 1
		for n < len(ops) && n < d.runSlots && ops[n].slot == ops[n-1].slot+1 {
			n++
		}
		run := ops[:n]
		ops = ops[n:]
		out = append(out, func() {
			defer b.finish()
			d.runIO(run, write, b)
		})
	}
	b.left = len(out)
	if b.left == 0 {
		close(b.done)
	}
	return out
}

// runIO moves one run of consecutive slots in one vectored call; when the
// call fails, each blob is retried alone, so a failure is charged only to
// the blobs it hits.
func (d *diskIO) runIO(run []blobOp, write bool, b *diskBatch) {
	s := d.getScratch()
	defer d.scratch.Put(s)
	if write && len(run) == 1 {
		d.record(s, run, true, d.writeLone(s, run[0]), b)
		return
	}
	if write {
		for k := range run {
			d.seal(s, k, run[k])
		}
	}
	err := d.vec(s, run, write)
	if err != nil && len(run) > 1 {
		for k := range run {
			if write {
				d.seal(s, 0, run[k])
			}
			d.record(s, run[k:k+1], write, d.vec(s, run[k:k+1], write), b)
		}
		return
	}
	d.record(s, run, write, err, b)
}

// writeLone writes a run of one slot (every run, for blobs of more than
// half of diskRunBytes) payload first, with the payload's checksum computed
// meanwhile on another goroutine, then the header block: the device gets the
// payload without waiting for the CRC, which costs a core about 0.2 ms per
// 2 MiB. A blob whose payload write fails keeps the slot's old header, whose
// tag no read of this write accepts.
func (d *diskIO) writeLone(s *ioScratch, op blobOp) error {
	hdr := s.hdr[:d.payOff]
	sealed := make(chan struct{})
	go func() {
		defer close(sealed)
		op.hdr.Seal(op.buf)
		op.hdr.Put(hdr[:d.hdrBytes])
	}()
	iov, p := s.iov[:0], d.inPlace(op.buf)
	if p > 0 {
		iov = append(iov, op.buf[:p])
	}
	if p < d.blob || d.stride-d.payOff > p {
		t := d.tailBuf(s, 0)
		clear(t[copy(t, op.buf[p:]):])
		iov = append(iov, t[:d.stride-d.payOff-p])
	}
	s.iov = iov
	off := int64(op.slot) * d.stride
	err := writevAt(d.file, iov, off+d.payOff)
	<-sealed
	if err != nil {
		return err
	}
	_, err = d.file.WriteAt(hdr, off)
	return err
}

// record notes the outcome of run, moved by one call that returned err: a
// read's blobs are checked (their payload tails copied out first).
func (d *diskIO) record(s *ioScratch, run []blobOp, write bool, err error, b *diskBatch) {
	what := "read"
	if write {
		what = "write"
	}
	for k, op := range run {
		e := err
		if e == nil && !write {
			e = d.check(s, k, op)
		}
		if e != nil {
			b.fail(op.i, fmt.Errorf("%w: disk %s of slot %d: %w", ErrIO, what, op.slot, e))
		}
	}
}

// seal puts op's header, with the payload's checksum, into header block k.
func (d *diskIO) seal(s *ioScratch, k int, op blobOp) {
	op.hdr.Seal(op.buf)
	op.hdr.Put(s.hdr[int64(k)*d.payOff : int64(k)*d.payOff+d.hdrBytes])
	if p := d.inPlace(op.buf); p < d.blob {
		t := d.tailBuf(s, k)
		n := copy(t, op.buf[p:])
		clear(t[n:])
	}
}

// vec makes the vectored call for run: per slot its header block, its
// in-place payload and, where needed, its tail.
func (d *diskIO) vec(s *ioScratch, run []blobOp, write bool) error {
	iov := s.iov[:0]
	for k, op := range run {
		iov = append(iov, s.hdr[int64(k)*d.payOff:int64(k+1)*d.payOff])
		p := d.inPlace(op.buf)
		if p > 0 {
			iov = append(iov, op.buf[:p])
		}
		if rest := d.stride - d.payOff - p; rest > 0 {
			iov = append(iov, d.tailBuf(s, k)[:rest])
		}
	}
	s.iov = iov
	off := int64(run[0].slot) * d.stride
	if write {
		return writevAt(d.file, iov, off)
	}
	return readvAt(d.file, iov, off)
}

// check verifies the blob read into header block k and op's buffer (whose
// tail it copies out of the scratch first) against op.want.
func (d *diskIO) check(s *ioScratch, k int, op blobOp) error {
	if p := d.inPlace(op.buf); p < d.blob {
		copy(op.buf[p:], d.tailBuf(s, k))
	}
	h, err := blob.Decode(s.hdr[int64(k)*d.payOff:int64(k)*d.payOff+d.hdrBytes], d.tokens)
	switch {
	case err != nil:
		return err
	case h.Fingerprint != op.want.fp || h.LifeCycle != uint32(op.want.lc):
		return fmt.Errorf("%w: blob of layout %v lifecycle %d, want %v lifecycle %d",
			blob.ErrCorrupt, h.Fingerprint, h.LifeCycle, op.want.fp, op.want.lc)
	case h.Tag != op.want.tag:
		return fmt.Errorf("%w: blob written as %d, want %d (stale slot)", blob.ErrCorrupt, h.Tag, op.want.tag)
	}
	return h.Verify(op.buf)
}

// wipe zeroes the header block of slot s, so no reader (a later manager on
// a persistent tier) takes what it holds for a blob. It is best effort: a
// wipe the disk refuses leaves the header, as a crash before it would.
func (d *diskIO) wipe(s int32) {
	d.file.WriteAt(alignedBuf(d.payOff, d.align), int64(s)*d.stride)
}

// do runs ops on the calling goroutine and returns the first blob's
// failure: the synchronous form, for start-up and tests.
func (d *diskIO) do(ops []blobOp, write bool) error {
	b := newDiskBatch(len(ops))
	for _, job := range d.jobs(ops, write, b) {
		job()
	}
	for i := range ops {
		if err := b.err(i); err != nil {
			return err
		}
	}
	return nil
}

// each runs fn for 0 ≤ i < n on up to diskQueueDepth goroutines, each with
// its own aligned scratch of one header block (payOff bytes), and returns
// the errors joined (the others still finish what they started). Start-up
// reads headers with it.
func (d *diskIO) each(n int, fn func(i int, scratch []byte) error) error {
	workers := min(n, diskQueueDepth)
	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := alignedBuf(d.payOff, d.align)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i, buf); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
