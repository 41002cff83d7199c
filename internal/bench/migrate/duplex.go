package migrate

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"
	"unsafe"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/staged"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/bench/stats"
)

// Staged is the staged codec (core/codec/staged): the gather kernel on CUDA,
// the default codec's device copies on emu, into device staging, then DMA.
const Staged = "staged"

// DuplexResult is one codec at one chunk size in duplex mode: DownBytes
// encoded (GPU→host) on one stream while UpBytes are decoded (host→GPU) on
// another, beside each direction alone and the contiguous DMA limits, all
// measured in the same run.
type DuplexResult struct {
	Codec              string
	Chunk              int64
	Pools              int
	DownPages, UpPages int
	// DownGBs and UpGBs are each direction alone; LimitD2H and LimitH2D the
	// contiguous copy of the same bytes alone.
	DownGBs, UpGBs     float64
	LimitD2H, LimitH2D float64
	// DuplexGBs is (DownBytes+UpBytes) over the time both took at once;
	// LimitDuplex the same for the two contiguous copies at once.
	DuplexGBs, LimitDuplex float64
	// DuplexRatio, DownRatio and UpRatio are the medians, over the rounds,
	// of the codec's GB/s over its limit's measured in the same round: the
	// reference runs just before the codec, so a drift of the link between
	// rounds cancels out of the ratio.
	DuplexRatio, DownRatio, UpRatio float64
	Verified                        bool
}

// WriteDuplexTable prints duplex results as a Markdown table.
func WriteDuplexTable(w io.Writer, res []DuplexResult) {
	fmt.Fprintln(w, "| codec | chunk × pools | pages down / up | duplex GB/s | two-stream limit GB/s | duplex / limit | down alone GB/s (/ limit) | up alone GB/s (/ limit) | verified |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range res {
		ver := "no"
		if r.Verified {
			ver = "every byte"
		}
		fmt.Fprintf(w, "| %s | %s × %d | %d / %d | %.2f | %.2f | %.3f | %.2f (%.3f) | %.2f (%.3f) | %s |\n",
			r.Codec, size(r.Chunk), r.Pools, r.DownPages, r.UpPages, r.DuplexGBs, r.LimitDuplex, r.DuplexRatio,
			r.DownGBs, r.DownRatio, r.UpGBs, r.UpRatio, ver)
	}
}

// CodecMaker makes a fresh codec by name on the run's device.
type CodecMaker func(name string) (codec.ColdPageCodec, error)

// RunDuplex is the duplex mode on any device: per chunk size, hot pools of
// DownBytes+UpBytes; the first DownBytes' slots, in a random order, are
// encoded into one host buffer while the other host buffer's pages are
// decoded into the remaining slots, in a random order. Every byte of both
// directions is verified before timing. Times are wall clock around the
// submissions and the synchronization of both streams, so a codec's host
// submit cost counts as it does in the manager, which submits both
// directions from one thread. After one warm-up round, each of Runs rounds
// times, per direction and both at once, the contiguous limit and then every
// codec; figures are medians over the rounds.
func RunDuplex(dev device.Device, cfg Config, mk CodecMaker, log io.Writer) ([]DuplexResult, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	var out []DuplexResult
	for _, c := range cfg.Chunks {
		r, err := duplexChunk(dev, cfg, mk, c, log)
		out = append(out, r...)
		if err != nil {
			return out, fmt.Errorf("chunk %s: %w", size(c), err)
		}
	}
	return out, nil
}

type duplexRig struct {
	dev      device.Device
	cfg      Config
	chunk    int64
	down, up int // pages
	page     int64
	hot      []device.Memory
	coldDown device.Memory // host: encode target
	coldUp   device.Memory // host: decode source
	idx      device.Memory // device: index pairs for device-index codecs
	sd, su   device.Stream
	image    [][]byte // per pool, the original slots
	enc, dec []codec.PageIndexPair
	mems     []device.Memory
	streams  []device.Stream
}

func (r *duplexRig) alloc(kind device.MemoryKind, n int64) (device.Memory, error) {
	m, err := r.dev.Alloc(kind, n)
	if err == nil {
		r.mems = append(r.mems, m)
	}
	return m, err
}

func (r *duplexRig) close() error {
	var errs []error
	for _, s := range r.streams {
		errs = append(errs, s.Synchronize(), s.Close())
	}
	for _, m := range r.mems {
		errs = append(errs, m.Free())
	}
	return errors.Join(errs...)
}

func duplexChunk(dev device.Device, cfg Config, mk CodecMaker, c int64, log io.Writer) (out []DuplexResult, err error) {
	r := &duplexRig{dev: dev, cfg: cfg, chunk: c, page: c * int64(cfg.Pools)}
	r.down = int(cfg.TotalBytes / r.page)
	r.up = int(cfg.DuplexUpBytes / r.page)
	defer func() { err = errors.Join(err, r.close()) }()
	if err := r.setup(); err != nil {
		return nil, err
	}
	passes := []pass{r.limitPass()}
	defer func() {
		for _, p := range passes {
			if p.close != nil {
				err = errors.Join(err, p.close())
			}
		}
	}()
	for _, name := range cfg.Codecs {
		p, err := r.codecPass(name, mk)
		if err != nil {
			return nil, fmt.Errorf("%s codec: %w", name, err)
		}
		passes = append(passes, p)
	}
	if err := r.rounds(passes); err != nil {
		return nil, err
	}
	lim := passes[0]
	limD2H, limH2D, limDuplex := stats.Median(lim.gbs[modeDown]), stats.Median(lim.gbs[modeUp]), stats.Median(lim.gbs[modeBoth])
	fmt.Fprintf(log, "chunk %s: %d pages down, %d up; contiguous D2H %.1f, H2D %.1f, both at once %.1f GB/s\n",
		size(c), r.down, r.up, limD2H, limH2D, limDuplex)
	for _, p := range passes[1:] {
		res := DuplexResult{Codec: p.name, Chunk: c, Pools: cfg.Pools, DownPages: r.down, UpPages: r.up, Verified: p.verified,
			LimitD2H: limD2H, LimitH2D: limH2D, LimitDuplex: limDuplex,
			DownGBs: stats.Median(p.gbs[modeDown]), UpGBs: stats.Median(p.gbs[modeUp]), DuplexGBs: stats.Median(p.gbs[modeBoth]),
			DownRatio: stats.MedianRatio(p.gbs[modeDown], lim.gbs[modeDown]), UpRatio: stats.MedianRatio(p.gbs[modeUp], lim.gbs[modeUp]),
			DuplexRatio: stats.MedianRatio(p.gbs[modeBoth], lim.gbs[modeBoth])}
		fmt.Fprintf(log, "  %-8s duplex %6.2f GB/s (%.3f of limit)  down %6.2f (%.3f)  up %6.2f (%.3f)  host submit of both %.2f ms\n",
			p.name, res.DuplexGBs, res.DuplexRatio, res.DownGBs, res.DownRatio, res.UpGBs, res.UpRatio, stats.Median(p.submitMs[modeBoth]))
		out = append(out, res)
	}
	return out, nil
}

// The three timings of a pass: encode alone, decode alone, both at once.
const (
	modeDown = iota
	modeUp
	modeBoth
	modes
)

// pass is what one round times: the contiguous limit or one codec, with
// its GB/s per mode, one entry per round.
type pass struct {
	name     string
	down, up func() error
	close    func() error
	verified bool
	gbs      [modes][]float64
	// submitMs is the host time of the submissions, before the streams
	// are synchronized: in duplex mode the second direction starts only
	// after the first one's submission, so a codec's host cost per page
	// delays the overlap.
	submitMs [modes][]float64
}

// rounds runs one warm-up round and then Runs timed rounds; in each round
// every mode times every pass in turn.
func (r *duplexRig) rounds(passes []pass) error {
	for round := range r.cfg.Runs + 1 {
		for m := range modes {
			for i := range passes {
				p := &passes[i]
				down, up := p.down, p.up
				switch m {
				case modeDown:
					up = nil
				case modeUp:
					down = nil
				}
				gbs, submit, err := r.time(down, up)
				if err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				if round > 0 {
					p.gbs[m] = append(p.gbs[m], gbs)
					p.submitMs[m] = append(p.submitMs[m], submit.Seconds()*1e3)
				}
			}
		}
	}
	return nil
}

// limitPass is the contiguous copies of the same bytes, per pool one
// descriptor: D2H on one stream, H2D on the other.
func (r *duplexRig) limitPass() pass {
	var d2h, h2d []device.CopyDesc
	for p, m := range r.hot {
		dn, up := int64(r.down)*r.chunk, int64(r.up)*r.chunk
		d2h = append(d2h, device.CopyDesc{Dst: r.coldDown.Ptr().Add(int64(p) * dn), Src: m.Ptr(), Size: dn})
		h2d = append(h2d, device.CopyDesc{Dst: m.Ptr().Add(dn), Src: r.coldUp.Ptr().Add(int64(p) * up), Size: up})
	}
	return pass{name: "contiguous",
		down: func() error { return r.sd.BatchCopy(d2h) },
		up:   func() error { return r.su.BatchCopy(h2d) }}
}

// time is GB/s of the bytes down and/or up move in one run, and how long
// their submission took on the host.
func (r *duplexRig) time(down, up func() error) (float64, time.Duration, error) {
	var bytes int64
	if down != nil {
		bytes += int64(r.down) * r.page
	}
	if up != nil {
		bytes += int64(r.up) * r.page
	}
	start := time.Now()
	for _, f := range []func() error{down, up} {
		if f != nil {
			if err := f(); err != nil {
				return 0, 0, err
			}
		}
	}
	submit := time.Since(start)
	if err := errors.Join(r.sd.Synchronize(), r.su.Synchronize()); err != nil {
		return 0, 0, err
	}
	return float64(bytes) / time.Since(start).Seconds() / 1e9, submit, nil
}

func (r *duplexRig) setup() error {
	slots := int64(r.down + r.up)
	per := slots * r.chunk
	for range r.cfg.Pools {
		m, err := r.alloc(device.DeviceMemory, per)
		if err != nil {
			return err
		}
		r.hot = append(r.hot, m)
	}
	var err error
	if r.coldDown, err = r.alloc(device.HostMapped, int64(r.down)*r.page); err != nil {
		return err
	}
	if r.coldUp, err = r.alloc(device.HostMapped, int64(r.up)*r.page); err != nil {
		return err
	}
	if r.idx, err = r.alloc(device.DeviceMemory, slots*codec.PageIndexPairBytes); err != nil {
		return err
	}
	for range 2 {
		s, err := r.dev.NewStream()
		if err != nil {
			return err
		}
		r.streams = append(r.streams, s)
	}
	r.sd, r.su = r.streams[0], r.streams[1]
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(r.chunk)))
	for i, s := range rng.Perm(r.down) {
		r.enc = append(r.enc, codec.PageIndexPair{Dst: int32(i), Src: int32(s)})
	}
	for i, s := range rng.Perm(r.up) {
		r.dec = append(r.dec, codec.PageIndexPair{Dst: int32(r.down + s), Src: int32(i)})
	}
	if r.cfg.SkipVerify {
		return nil
	}
	r.image = make([][]byte, r.cfg.Pools)
	for p := range r.image {
		r.image[p] = make([]byte, per)
		fill := rand.New(rand.NewPCG(r.cfg.Seed+uint64(p), 17))
		for i := 0; i < len(r.image[p]); i += 8 {
			v := fill.Uint64()
			copy(r.image[p][i:], unsafe.Slice((*byte)(unsafe.Pointer(&v)), 8))
		}
	}
	return nil
}

func (r *duplexRig) desc() layout.PoolGroupDesc {
	g := layout.PoolGroupDesc{Index: 0, NumSlots: int64(r.down + r.up), LifeCycles: []layout.LayerGroupID{0}}
	for _, m := range r.hot {
		g.Pools = append(g.Pools, layout.PoolDesc{Base: m.Ptr(), SlotBytes: r.chunk})
	}
	return g
}

// codecPass makes and configures the codec name and verifies every byte of
// a duplex run of it (unless SkipVerify); its close destroys the codec.
func (r *duplexRig) codecPass(name string, mk CodecMaker) (p pass, err error) {
	cd, err := mk(name)
	if err != nil {
		return p, err
	}
	p = pass{name: name, close: func() error {
		return errors.Join(r.sd.Synchronize(), r.su.Synchronize(), codec.Destroy(cd))
	}}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
		}
	}()
	if !cd.Configure([]layout.PoolGroupDesc{r.desc()}) {
		return p, errors.New("configure failed")
	}
	if got := cd.QueryColdPageBytes(0); got != r.page {
		return p, fmt.Errorf("cold page of %d bytes, want the concatenated %d", got, r.page)
	}
	devIdx := cd.QueryPageIndexLocation(0) == codec.Device
	call := func(pairs []codec.PageIndexPair, base device.Ptr, s device.Stream, at device.Ptr,
		fn func(device.Ptr, codec.PageIndices, device.Stream) bool) error {
		if !devIdx {
			if !fn(base, codec.HostIndices(pairs), s) {
				return errors.New("codec call failed")
			}
			return nil
		}
		step := r.cfg.IndexChunkPairs
		for i := 0; i < len(pairs); i += step {
			j := min(i+step, len(pairs))
			p := at.Add(int64(i) * codec.PageIndexPairBytes)
			if err := s.CopyFromHost(p, unsafe.Slice((*byte)(unsafe.Pointer(&pairs[i])), (j-i)*codec.PageIndexPairBytes)); err != nil {
				return err
			}
			if !fn(base, codec.DeviceIndices(p, j-i), s) {
				return fmt.Errorf("codec call on pairs [%d, %d) failed", i, j)
			}
		}
		return nil
	}
	down := func() error {
		return call(r.enc, r.coldDown.Ptr(), r.sd, r.idx.Ptr(), func(b device.Ptr, ix codec.PageIndices, s device.Stream) bool {
			return cd.Encode(0, b, ix, s)
		})
	}
	up := func() error {
		return call(r.dec, r.coldUp.Ptr(), r.su, r.idx.Ptr().Add(int64(r.down)*codec.PageIndexPairBytes),
			func(b device.Ptr, ix codec.PageIndices, s device.Stream) bool { return cd.Decode(0, b, ix, s) })
	}
	p.down, p.up = down, up
	if !r.cfg.SkipVerify {
		if err := r.verify(down, up); err != nil {
			return p, err
		}
		p.verified = true
	}
	return p, nil
}

// verify loads the image into the hot pools and the up pages' cold bytes,
// poisons what the run writes, runs both directions at once and checks every
// cold page written and every hot slot decoded.
func (r *duplexRig) verify(down, up func() error) error {
	per := r.hot[0].Size()
	stage, err := r.dev.Alloc(device.HostMapped, per)
	if err != nil {
		return err
	}
	defer stage.Free()
	for p, m := range r.hot {
		copy(stage.Host(), r.image[p])
		for _, pr := range r.dec { // poison the slots the decode writes
			clear(stage.Host()[int64(pr.Dst)*r.chunk:][:r.chunk])
		}
		if err := r.sd.BatchCopy([]device.CopyDesc{{Dst: m.Ptr(), Src: stage.Ptr(), Size: per}}); err != nil {
			return err
		}
		if err := r.sd.Synchronize(); err != nil {
			return err
		}
	}
	cu := r.coldUp.Host()
	for _, pr := range r.dec {
		for p := range r.hot {
			copy(cu[int64(pr.Src)*r.page+int64(p)*r.chunk:][:r.chunk], r.image[p][int64(pr.Dst)*r.chunk:][:r.chunk])
		}
	}
	clear(r.coldDown.Host())
	if err := errors.Join(down(), up()); err != nil {
		return err
	}
	if err := errors.Join(r.sd.Synchronize(), r.su.Synchronize()); err != nil {
		return err
	}
	cd := r.coldDown.Host()
	for _, pr := range r.enc {
		for p := range r.hot {
			if !bytes.Equal(cd[int64(pr.Dst)*r.page+int64(p)*r.chunk:][:r.chunk], r.image[p][int64(pr.Src)*r.chunk:][:r.chunk]) {
				return fmt.Errorf("cold page %d pool %d differs from hot slot %d", pr.Dst, p, pr.Src)
			}
		}
	}
	for p, m := range r.hot {
		if err := r.sd.BatchCopy([]device.CopyDesc{{Dst: stage.Ptr(), Src: m.Ptr(), Size: per}}); err != nil {
			return err
		}
		if err := r.sd.Synchronize(); err != nil {
			return err
		}
		if !bytes.Equal(stage.Host(), r.image[p]) {
			return fmt.Errorf("pool %d differs after the duplex run", p)
		}
	}
	return nil
}

// emuCodecs makes the codecs duplex mode runs on the emulated device.
func emuCodecs(dev device.Device, stage staged.Options) CodecMaker {
	return func(name string) (codec.ColdPageCodec, error) {
		switch name {
		case Default:
			return codec.NewDefault(), nil
		case Staged:
			return staged.New(dev, codec.NewDefault(), stage)
		}
		return nil, fmt.Errorf("the emulated device runs the %s and %s codecs, not %q", Default, Staged, name)
	}
}

// RunDuplexEmu is duplex mode on the emulated device, where a copy is a
// host memmove: it checks the mode end to end and compares codecs'
// bookkeeping; only a GPU gives PCIe figures.
func RunDuplexEmu(cfg Config, stage staged.Options, log io.Writer) ([]DuplexResult, string, error) {
	if err := cfg.fill(); err != nil {
		return nil, "", err
	}
	dev := emu.New(emu.Options{})
	defer dev.Close()
	header := fmt.Sprintf("kvcm bench migrate -duplex: emulated device (host memmove), %d MiB down and %d MiB up per run, median of %d runs, wall clock; %s",
		cfg.TotalBytes>>20, cfg.DuplexUpBytes>>20, cfg.Runs, describeStaging(stage))
	res, err := RunDuplex(dev, cfg, emuCodecs(dev, stage), log)
	return res, header, err
}

// describeStaging names the staged codec's effective chunk and ring, so a
// recorded table says which staging it measured.
func describeStaging(o staged.Options) string {
	chunk, ring := o.ChunkBytes, o.RingChunks
	if chunk == 0 {
		chunk = staged.DefaultChunkBytes
	}
	if ring == 0 {
		ring = staged.DefaultRingChunks
	}
	mode := "pipelined"
	if o.Serial {
		mode = "serial"
	}
	return fmt.Sprintf("staged: %d KiB chunks, ring of %d, %s", chunk>>10, ring, mode)
}
