package core

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/kvcm/kvcm/core/blob"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/core/staging"
)

// Path is one of the design's migration paths.
type Path int

const (
	HotToHost Path = iota
	HostToHot
	HotToDisk
	DiskToHot
	HostToDisk
	DiskToHost
	HotToHot
	ColdToCold
	numPaths
)

var pathNames = [numPaths]string{
	"gpu→host", "host→gpu", "gpu→disk", "disk→gpu", "host→disk", "disk→host", "gpu→gpu", "cold→cold",
}

func (p Path) String() string {
	if p >= 0 && p < numPaths {
		return pathNames[p]
	}
	return fmt.Sprintf("Path(%d)", int(p))
}

// Paths lists every migration path.
func Paths() []Path {
	out := make([]Path, numPaths)
	for i := range out {
		out[i] = Path(i)
	}
	return out
}

// MigrationCounter counts pages and bytes moved on one path (bytes as they
// travel: hot page bytes on hot/hot, cold blob bytes otherwise).
type MigrationCounter struct {
	Pages, Bytes int64
}

func pathOf(src, dst *slotGroup) Path {
	sk, dk := src.level.kind, dst.level.kind
	switch {
	case sk == config.GPUTier && dk == config.GPUTier:
		return HotToHot
	case sk == config.GPUTier && dk == config.HostTier:
		return HotToHost
	case sk == config.GPUTier:
		return HotToDisk
	case dk == config.GPUTier && sk == config.HostTier:
		return HostToHot
	case dk == config.GPUTier:
		return DiskToHot
	case sk == config.HostTier && dk == config.DiskTier:
		return HostToDisk
	case sk == config.DiskTier && dk == config.HostTier:
		return DiskToHost
	}
	return ColdToCold
}

// move is one page's transfer from its slot to a new slot.
type move struct {
	p       *page
	srcSlot int32
	dstSlot int32
	// tag is the writer tag of the blob a move to disk writes.
	tag uint64
}

// unit is one transaction: moves sharing source group, destination group and
// (for hot/cold conversions) batching representative, small enough for one
// codec call.
type unit struct {
	src, dst *slotGroup
	rep      layout.LayerGroupID
	moves    []move
	// disk is the blob I/O of a unit that reads or writes a disk tier.
	disk *diskBatch
	// copy: the moves' pages are new pages the transfer fills from the
	// source slots, which stay their owners' (see copyToCold); after, if
	// set, is an event the transfer waits for first.
	copy  bool
	after *sharedEvent
}

// inflight is a submitted transaction whose finish event has not been seen
// complete: an asynchronous failure marks its pages lost, and so does the
// failure of one page's blob (disk), for that page alone.
type inflight struct {
	ev    *sharedEvent
	pages []*page
	disk  *diskBatch
	// prev holds, for a page that an earlier transaction was still moving
	// when this one took it, that transaction and the page's index there:
	// a blob the earlier one lost is lost in this one's copy too.
	prev map[int]pageRef
	// landing: the transaction lands blobs fetched from the shared tier
	// (landShared); its failed disk writes count as SharedStats.FailedLandings.
	landing bool
}

type pageRef struct {
	fl *inflight
	i  int
}

// checkBlobs makes stream fail, after the waits enqueued on it so far, when
// the blob of one of the pages each visits failed in a disk transaction not
// yet settled: an engine that synchronizes its stream after Resume learns of
// the loss before it reads the page's bytes, and only the caches holding a
// lost page see it.
func (m *Manager) checkBlobs(stream device.Stream, each func(fn func(p *page))) error {
	var refs []pageRef
	each(func(p *page) {
		if fl := p.inflight; fl != nil && (fl.disk != nil || fl.prev != nil) {
			refs = append(refs, pageRef{fl: fl, i: int(p.inflightIdx)})
		}
	})
	if len(refs) == 0 {
		return nil
	}
	return stream.HostFunc(func() error {
		for _, r := range refs {
			if err := r.fl.blobErr(r.i); err != nil {
				return err
			}
		}
		return nil
	})
}

// blobErr is the failure of page i's blob in this transaction or in the
// unsettled ones that moved it before.
func (fl *inflight) blobErr(i int) error {
	for {
		if fl.disk != nil {
			if err := fl.disk.err(i); err != nil {
				return err
			}
		}
		r, ok := fl.prev[i]
		if !ok {
			return nil
		}
		fl, i = r.fl, r.i
	}
}

// migrate moves pages to level dst, one transaction per unit: destination
// slots are allocated first, the unit's stream (streamOf) waits for the
// source and destination fences, whatever streams recorded them (and, for a
// codec that does not declare codec.MultiStream, for its previous call), the
// transfer is submitted, one finish event is
// recorded and attached to both sides, observers are notified, and only then
// does the page change slots. A unit that fails synchronously releases its
// destination slots and leaves its pages where they were (retryable), except
// when the codec failed to decode them: their only copy cannot be brought
// back, so they are lost (see lose). The error reports every failed unit.
func (m *Manager) migrate(pages []*page, dst int) error {
	if len(pages) == 0 {
		return nil
	}
	for _, p := range pages {
		p.moving = true
		p.refresh()
	}
	defer func() {
		for _, p := range pages {
			p.moving = false
			if p.group != nil { // a lost page nobody held is freed
				p.refresh()
			}
		}
	}()
	dl := m.levels[dst]
	var few [4]groupNeed
	n := need(few[:0])
	for _, p := range pages {
		n = n.add(dl.groupOf(p.lc), 1)
	}
	if err := m.reserveAt(dst, n); err != nil {
		return err
	}
	var errs []error
	for _, u := range m.plan(pages, dl) {
		err := m.runUnit(u)
		if err == nil {
			continue
		}
		for _, mv := range u.moves {
			u.dst.releaseSlot(mv.dstSlot)
		}
		err = fmt.Errorf("%v migration of %d pages: %w", pathOf(u.src, u.dst), len(u.moves), err)
		if dl.index == 0 && errors.Is(err, ErrCodecFailed) {
			for _, mv := range u.moves {
				m.lose(mv.p, err)
			}
			err = fmt.Errorf("%w; the pages are dropped", err)
		}
		errs = append(errs, err)
	}
	return joinErrs(errs)
}

// plan takes destination slots and groups the moves into units, in order of
// first appearance.
func (m *Manager) plan(pages []*page, dl *storageLevel) []unit {
	type key struct {
		src, dst *slotGroup
		rep      layout.LayerGroupID
	}
	var order []key
	byKey := map[key][]move{}
	for _, p := range pages {
		dg := dl.groupOf(p.lc)
		k := key{src: p.group, dst: dg, rep: -1}
		if (p.group.level.index == 0) != (dl.index == 0) {
			k.rep = m.lcCodec[p.lc].rep
		}
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		mv := move{p: p, srcSlot: p.slot, dstSlot: dg.takeSlot()}
		if dg.onDisk() {
			m.diskSeq++
			mv.tag = m.diskSeq
		}
		byKey[k] = append(byKey[k], mv)
	}
	var units []unit
	for _, k := range order {
		moves := byKey[k]
		for len(moves) > 0 {
			n := m.unitSize(k.src, k.dst, k.rep, len(moves))
			units = append(units, unit{src: k.src, dst: k.dst, rep: k.rep, moves: moves[:n]})
			moves = moves[n:]
		}
	}
	return units
}

// unitSize caps a unit: device-index codec calls at the 64 KiB index batch,
// disk staging at a share of the page ring small enough that every disk
// stream has a unit in flight with the ring half used, so one unit's codec
// work overlaps the others' file I/O.
func (m *Manager) unitSize(src, dst *slotGroup, rep layout.LayerGroupID, n int) int {
	if rep >= 0 && m.lcCodec[rep].loc == codec.Device {
		n = min(n, staging.MaxIndexBatchPairs)
	}
	if rep >= 0 && (src.onDisk() || dst.onDisk()) {
		blob := m.lcCodec[rep].coldBytes
		n = min(n, int(max(m.pageRing.Capacity()/blob/(2*numDiskStreams), 1)))
	}
	return n
}

// numDiskStreams is how many disk streams take the disk transactions in
// turn: each holds one transaction's codec work and waits for its file I/O,
// so several transactions keep the disk workers busy.
const numDiskStreams = 4

// streamOf is the stream of unit u: the next disk stream when the unit reads
// or writes a disk tier, so disk I/O never delays the GPU↔host migrations;
// the onboarding stream for host→GPU, so an onboarding never queues behind
// an eviction; the migration stream otherwise. Streams are ordered only by
// the slots' fences, which runUnit waits on whatever stream recorded them.
func (m *Manager) streamOf(u unit) device.Stream {
	switch {
	case u.src.onDisk() || u.dst.onDisk():
		st := m.diskStreams[m.nextDisk]
		m.nextDisk = (m.nextDisk + 1) % len(m.diskStreams)
		return st
	case pathOf(u.src, u.dst) == HostToHot:
		return m.upStream
	}
	return m.stream
}

// migrationStreams are the manager's own streams that exist.
func (m *Manager) migrationStreams() []device.Stream {
	var out []device.Stream
	for _, st := range append([]device.Stream{m.stream, m.upStream}, m.diskStreams...) {
		if st != nil {
			out = append(out, st)
		}
	}
	return out
}

// runUnit submits one transaction on its stream (see streamOf) and, on
// success, moves ownership.
func (m *Manager) runUnit(u unit) error {
	st := m.streamOf(u)
	waits := waitSet{}
	for _, mv := range u.moves {
		waits.addFence(u.src.fences[mv.srcSlot])
		waits.addFence(u.dst.fences[mv.dstSlot])
	}
	if u.after != nil {
		waits.add(u.after)
	}
	serial := u.rep >= 0 && m.codecSerial // a codec call, ordered across streams
	if serial && m.lastCodec != nil {
		waits.add(m.lastCodec)
	}
	if err := waits.apply(st); err != nil {
		return err
	}
	if u.src.onDisk() || u.dst.onDisk() {
		u.disk = newDiskBatch(len(u.moves))
	}
	release, err := m.submitUnit(u, st)
	if err != nil {
		m.drainAfterFailure(st)
		if release != nil {
			release()
		}
		return err
	}
	ev, err := m.events.record(st)
	if release != nil {
		// Released after the finish event, so the event keeps the unit's
		// failures and protects the staging bytes. The lease ends even when
		// Release reports that it synchronized instead of recording.
		release()
	}
	if err != nil {
		m.drainAfterFailure(st)
		return err
	}
	if serial {
		ev.refs++
		if m.lastCodec != nil {
			m.events.release(m.lastCodec)
		}
		m.lastCodec = ev
	}
	fl := &inflight{ev: ev, disk: u.disk}
	path := pathOf(u.src, u.dst)
	for i, mv := range u.moves {
		p := mv.p
		if old := p.inflight; old != nil {
			if fl.prev == nil {
				fl.prev = map[int]pageRef{}
			}
			fl.prev[i] = pageRef{fl: old, i: int(p.inflightIdx)}
		}
		u.src.fences[mv.srcSlot].add(&m.events, ev)
		u.dst.fences[mv.dstSlot].add(&m.events, ev)
		if !u.copy {
			u.src.release(p)
		}
		u.dst.owner[mv.dstSlot] = p
		p.group, p.slot, p.diskTag = u.dst, mv.dstSlot, mv.tag
		fl.pages = append(fl.pages, p)
		p.inflight, p.inflightIdx = fl, int32(i)
		if u.src.level != u.dst.level && !u.copy {
			m.emitMoved(p, u.src.level.index)
		}
		c := &m.migrations[path]
		c.Pages++
		bytes := m.lcCodec[p.lc].coldBytes
		if path == HotToHot {
			bytes = u.src.desc.PageBytes()
		}
		c.Bytes += bytes
		m.stats.onMoved(p.lc, path, bytes)
	}
	m.pending = append(m.pending, fl)
	return nil
}

// drainAfterFailure waits for whatever part of a failed unit was queued, so
// nothing reuses its slots or staging bytes too early, and closes the
// stream's failure interval so the next unit does not inherit it.
func (m *Manager) drainAfterFailure(st device.Stream) {
	st.Synchronize()
	if ev, err := m.events.record(st); err == nil {
		m.events.release(ev)
	}
}

// submitUnit enqueues the transfer of one unit. It returns a function that
// releases the unit's staging leases, to be called after the finish event is
// recorded.
func (m *Manager) submitUnit(u unit, st device.Stream) (func() error, error) {
	srcHot, dstHot := u.src.level.index == 0, u.dst.level.index == 0
	switch {
	case srcHot && dstHot:
		return nil, m.copyHot(u, st)
	case srcHot && !u.dst.onDisk():
		return m.codecCall(u, st, true, u.dst.mem[0].Ptr(), func(i int, mv move) codec.PageIndexPair {
			return codec.PageIndexPair{Dst: mv.dstSlot, Src: mv.srcSlot}
		})
	case dstHot && !u.src.onDisk():
		return m.codecCall(u, st, false, u.src.mem[0].Ptr(), func(i int, mv move) codec.PageIndexPair {
			return codec.PageIndexPair{Dst: mv.dstSlot, Src: mv.srcSlot}
		})
	case srcHot:
		return m.encodeToDisk(u, st)
	case dstHot:
		return m.decodeFromDisk(u, st)
	}
	return nil, m.copyCold(u, st)
}

// copyHot is the per-pool hot copy used by defragmentation.
func (m *Manager) copyHot(u unit, st device.Stream) error {
	descs := m.descs[:0]
	for _, mv := range u.moves {
		for pool, b := range u.src.desc.PoolBytes {
			descs = append(descs, device.CopyDesc{
				Dst: u.dst.slotAddr(pool, mv.dstSlot), Src: u.src.slotAddr(pool, mv.srcSlot), Size: b,
			})
		}
	}
	m.descs = descs
	return st.BatchCopy(descs)
}

// codecCall makes one encode (toCold) or decode call for the unit with the
// cold side at coldBase, uploading the index pairs first when the codec
// reads them from device memory.
func (m *Manager) codecCall(u unit, st device.Stream, toCold bool, coldBase device.Ptr, pair func(int, move) codec.PageIndexPair) (func() error, error) {
	pairs := m.pairs[:0]
	for i, mv := range u.moves {
		pairs = append(pairs, pair(i, mv))
	}
	m.pairs = pairs
	idx := codec.HostIndices(pairs)
	var release func() error
	if m.lcCodec[u.rep].loc == codec.Device {
		lease, err := m.indexRing.Upload(codec.PairBytes(pairs, &m.pairBytes), st)
		if err != nil {
			return nil, fmt.Errorf("upload page indices: %w", err)
		}
		release = lease.Release
		idx = codec.DeviceIndices(lease.Ptr(), len(pairs))
	}
	var ok bool
	if toCold {
		ok = m.codec.Encode(u.rep, coldBase, idx, st)
	} else {
		ok = m.codec.Decode(u.rep, coldBase, idx, st)
	}
	if !ok {
		op := "Decode"
		if toCold {
			op = "Encode"
		}
		err := fmt.Errorf("%w: %s(layer group %d, %d pages) %s", ErrCodecFailed, op, u.rep, len(pairs), m.codecWhy())
		if release != nil {
			release()
		}
		return nil, err
	}
	return release, nil
}

// stage leases pinned staging for the unit's blobs on stream st.
func (m *Manager) stage(u unit, st device.Stream) (*staging.StagingBuffer, int64, error) {
	blob := m.lcCodec[u.rep].coldBytes
	req, err := staging.PageRequest(blob, int64(len(u.moves)), int64(len(u.moves)))
	if err != nil {
		return nil, 0, err
	}
	buf, err := m.pageRing.Acquire(req, st)
	if err != nil {
		return nil, 0, fmt.Errorf("page staging: %w", err)
	}
	return buf, blob, nil
}

// encodeToDisk encodes into pinned staging, then has the disk workers write
// each blob, with its header, from the staging to its slot; the stream waits
// for the writes (waitHost) before the unit's finish event.
func (m *Manager) encodeToDisk(u unit, st device.Stream) (func() error, error) {
	buf, blob, err := m.stage(u, st)
	if err != nil {
		return nil, err
	}
	release, err := m.codecCall(u, st, true, buf.Ptr(), func(i int, mv move) codec.PageIndexPair {
		return codec.PageIndexPair{Dst: int32(i), Src: mv.srcSlot}
	})
	if err == nil {
		host, hdrs := buf.Host(), m.headers(u)
		ops := make([]blobOp, len(u.moves))
		for i, mv := range u.moves {
			ops[i] = blobOp{i: i, slot: mv.dstSlot, buf: host[int64(i)*blob : int64(i+1)*blob], hdr: &hdrs[i]}
		}
		err = m.diskIO(st, u.disk, u.dst.dio.jobs(ops, true, u.disk))
	}
	return joinRelease(release, buf.Release), err
}

// decodeFromDisk has the disk workers read and check the blobs into pinned
// staging, then decodes them. A blob that fails its check fails only its own
// page (see diskBatch): the decode's output for it is never used.
func (m *Manager) decodeFromDisk(u unit, st device.Stream) (func() error, error) {
	buf, blob, err := m.stage(u, st)
	if err != nil {
		return nil, err
	}
	host, wants := buf.Host(), m.wants(u)
	ops := make([]blobOp, len(u.moves))
	for i, mv := range u.moves {
		ops[i] = blobOp{i: i, slot: mv.srcSlot, buf: host[int64(i)*blob : int64(i+1)*blob], want: wants[i]}
	}
	err = m.diskIO(st, u.disk, u.src.dio.jobs(ops, false, u.disk))
	var release func() error
	if err == nil {
		release, err = m.codecCall(u, st, false, buf.Ptr(), func(i int, mv move) codec.PageIndexPair {
			return codec.PageIndexPair{Dst: mv.dstSlot, Src: int32(i)}
		})
	}
	return joinRelease(release, buf.Release), err
}

// diskIO enqueues jobs, the blob I/O of one unit, on stream st: a host
// function hands them to the disk workers when the stream reaches it (it
// never blocks), and the stream then waits for them without holding a host
// function (waitHost). If the wait cannot be enqueued, diskIO waits for the
// jobs itself, so nothing reuses their buffers early.
func (m *Manager) diskIO(st device.Stream, b *diskBatch, jobs []func()) error {
	q := m.diskQ
	if err := st.HostFunc(func() error { q.push(jobs); return nil }); err != nil {
		return err
	}
	if err := waitHost(st, b.done); err != nil {
		<-b.done
		return err
	}
	return nil
}

// waitHost makes work enqueued on st later wait until done is closed: with
// device.HostWaiter where the stream has it (no host-function thread is
// held meanwhile), else in a host function.
func waitHost(st device.Stream, done <-chan struct{}) error {
	if w, ok := st.(device.HostWaiter); ok {
		return w.WaitHost(done)
	}
	return st.HostFunc(func() error { <-done; return nil })
}

// copyCold moves raw blobs between cold groups: a batch copy between host
// slots, the disk workers' I/O in stream order otherwise, in place from and
// to the host tier's slots. Blobs read from disk are checked; blobs written
// to disk get a new header.
func (m *Manager) copyCold(u unit, st device.Stream) error {
	size := u.src.blobBytes()
	if !u.src.onDisk() && !u.dst.onDisk() {
		descs := m.descs[:0]
		for _, mv := range u.moves {
			descs = append(descs, device.CopyDesc{
				Dst: u.dst.mem[0].Ptr().Add(int64(mv.dstSlot) * size),
				Src: u.src.mem[0].Ptr().Add(int64(mv.srcSlot) * size), Size: size,
			})
		}
		m.descs = descs
		return st.BatchCopy(descs)
	}
	ops := make([]blobOp, len(u.moves))
	var jobs []func()
	switch {
	case u.src.onDisk() && u.dst.onDisk():
		jobs = m.diskToDisk(u)
	case u.src.onDisk():
		wants := m.wants(u)
		for i, mv := range u.moves {
			ops[i] = blobOp{i: i, slot: mv.srcSlot, buf: u.dst.hostSlot(mv.dstSlot), want: wants[i]}
		}
		jobs = u.src.dio.jobs(ops, false, u.disk)
	default:
		hdrs := m.headers(u)
		for i, mv := range u.moves {
			ops[i] = blobOp{i: i, slot: mv.dstSlot, buf: u.src.hostSlot(mv.srcSlot), hdr: &hdrs[i]}
		}
		jobs = u.dst.dio.jobs(ops, true, u.disk)
	}
	return m.diskIO(st, u.disk, jobs)
}

// diskToDisk is one job per blob of a unit between two disk groups: read
// and check it, then write it with a new header.
func (m *Manager) diskToDisk(u unit) []func() {
	src, dst, wants, hdrs := u.src.dio, u.dst.dio, m.wants(u), m.headers(u)
	jobs := make([]func(), len(u.moves))
	for i, mv := range u.moves {
		jobs[i] = func() {
			defer u.disk.finish()
			buf := alignedBuf(src.blob, max(src.align, dst.align))
			err := src.do([]blobOp{{slot: mv.srcSlot, buf: buf, want: wants[i]}}, false)
			if err == nil {
				err = dst.do([]blobOp{{slot: mv.dstSlot, buf: buf, hdr: &hdrs[i]}}, true)
			}
			if err != nil {
				u.disk.fail(i, fmt.Errorf("blob copy: %w", err))
			}
		}
	}
	u.disk.left = len(jobs)
	return jobs
}

// headers are the blob headers of the unit's moves to disk.
func (m *Manager) headers(u unit) []blob.Header {
	out := make([]blob.Header, len(u.moves))
	for i, mv := range u.moves {
		out[i] = m.diskHeader(mv.p, mv.tag)
	}
	return out
}

// wants are what the unit's moves from disk expect to read.
func (m *Manager) wants(u unit) []blobWant {
	out := make([]blobWant, len(u.moves))
	for i, mv := range u.moves {
		out[i] = m.wantOf(mv.p)
	}
	return out
}

func joinRelease(fns ...func() error) func() error {
	return func() error {
		var errs []error
		for _, f := range fns {
			if f != nil {
				errs = append(errs, f())
			}
		}
		return errors.Join(errs...)
	}
}

// settle retires completed transactions. A transaction that failed
// asynchronously leaves its pages' data unusable: they are marked lost,
// taken out of the tree, and their caches refuse to resume.
func (m *Manager) settle() {
	if len(m.pending) == 0 {
		return
	}
	kept := m.pending[:0]
	for _, fl := range m.pending {
		done, err := fl.ev.ev.Query()
		if !done {
			kept = append(kept, fl)
			continue
		}
		for i, p := range fl.pages {
			if fl.landing && fl.disk != nil && fl.disk.err(i) != nil {
				m.shared.stats.FailedLandings++ // whether or not the page moved again
			}
			if p.inflight != fl {
				continue // moved again: the later transaction carries this one's outcome (prev)
			}
			p.inflight = nil
			if err != nil && p.group.onDisk() {
				// The blob was written after work it depends on failed (an
				// asynchronous encode): it may look sound, so it must not
				// outlive the loss in a persistent tier's file.
				p.group.dio.wipe(p.slot)
			}
			if err := cmp.Or(err, fl.blobErr(i)); err != nil {
				m.lose(p, err)
			}
		}
		m.events.release(fl.ev)
	}
	for i := len(kept); i < len(m.pending); i++ {
		m.pending[i] = nil
	}
	m.pending = kept
}

// settlePages waits for the transactions that still move any of pages, then
// settles.
func (m *Manager) settlePages(pages func(fn func(p *page))) {
	if len(m.pending) == 0 {
		return // a page is in flight only while its transaction is pending
	}
	waits := waitSet{}
	pages(func(p *page) {
		if p.inflight != nil {
			waits.add(p.inflight.ev)
		}
	})
	if !waits.empty() {
		waits.synchronize()
		m.settle()
	}
}

// lose marks a page whose data a failure (err) destroyed: it leaves the
// tree at once, so nothing reuses it, and its slot returns when the last
// cache holding it closes. Every cache holding it gets ErrDataLost (see
// checkLost).
func (m *Manager) lose(p *page, err error) {
	if p.lost {
		return
	}
	p.lost = true
	m.lostBy[p] = err
	m.losses++
	if n := p.node; n != nil {
		m.pagesOf(n)[p.lc] = nil
		p.node = nil
		m.emitDropped(n, p.lc, layout.CacheLevel(p.level()))
		if !m.hasPages(n) {
			m.prune = append(m.prune, n)
		}
	}
	m.stats.onLost()
	if p.active == 0 && p.held == 0 {
		m.freePage(p)
		return
	}
	p.refresh()
}

// copyToCold fills np, a new page of src's layer group without a slot, with
// a copy of src (a page on the GPU level) on cold level lvl, through the
// codec as an eviction would, after the work on stream so far (which wrote
// src); stream then waits for the copy before it writes src again. The
// level must have a free slot (reserveAt). On error np has no slot and
// nothing changed.
func (m *Manager) copyToCold(stream device.Stream, np, src *page, lvl int) error {
	after, err := m.events.record(stream)
	if err != nil {
		return err
	}
	defer m.events.release(after)
	dst := m.levels[lvl].groupOf(src.lc)
	mv := move{p: np, srcSlot: src.slot, dstSlot: dst.takeSlot()}
	if dst.onDisk() {
		m.diskSeq++
		mv.tag = m.diskSeq
	}
	u := unit{src: src.group, dst: dst, rep: m.lcCodec[src.lc].rep, moves: []move{mv}, copy: true, after: after}
	if err := m.runUnit(u); err != nil {
		dst.releaseSlot(mv.dstSlot)
		return fmt.Errorf("%v copy of a page: %w", pathOf(u.src, u.dst), err)
	}
	waits := waitSet{skip: stream}
	waits.addFence(src.group.fences[src.slot])
	return waits.apply(stream)
}
