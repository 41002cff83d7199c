//go:build cgo

package migrate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/codec/gpucodec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/bench/stats"
)

// bench is the state of one Run.
type bench struct {
	cfg   Config
	dev   *cuda.Device
	s     *cuda.Stream
	log   io.Writer
	a, b  *cuda.Event
	image device.Memory   // host-mapped: the original pool contents, pool after pool
	pools []device.Memory // device: TotalBytes/Pools each
	cold  device.Memory   // host-mapped: TotalBytes
	back  device.Memory   // host-mapped: TotalBytes, read-back of the pools
	cont  device.Memory   // device: TotalBytes, the contiguous reference
	idx   device.Memory   // device: index pairs
	mems  []device.Memory
}

// Run runs the benchmark on dev and returns one Result per codec and chunk
// size, logging progress to log.
func Run(dev *cuda.Device, cfg Config, log io.Writer) (res []Result, err error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, dev: dev, log: log}
	defer func() { err = errors.Join(err, b.close()) }()
	if err := b.setup(); err != nil {
		return nil, err
	}
	for _, ch := range cfg.Chunks {
		r, err := b.chunk(ch)
		res = append(res, r...)
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

func (b *bench) alloc(kind device.MemoryKind, n int64) (device.Memory, error) {
	m, err := b.dev.Alloc(kind, n)
	if err == nil {
		b.mems = append(b.mems, m)
	}
	return m, err
}

func (b *bench) close() error {
	var errs []error
	if b.s != nil {
		errs = append(errs, b.s.Synchronize(), b.s.Close())
	}
	for _, e := range []*cuda.Event{b.a, b.b} {
		if e != nil {
			errs = append(errs, e.Close())
		}
	}
	for _, m := range b.mems {
		errs = append(errs, m.Free())
	}
	return errors.Join(errs...)
}

func (b *bench) setup() error {
	t := b.cfg.TotalBytes
	st, err := b.dev.NewStream()
	if err != nil {
		return err
	}
	b.s, _ = cuda.AsStream(st)
	if b.a, err = b.dev.NewTimingEvent(); err != nil {
		return err
	}
	if b.b, err = b.dev.NewTimingEvent(); err != nil {
		return err
	}
	for _, x := range []struct {
		dst  *device.Memory
		kind device.MemoryKind
	}{{&b.image, device.HostMapped}, {&b.cold, device.HostMapped}, {&b.back, device.HostMapped}, {&b.cont, device.DeviceMemory}} {
		if *x.dst, err = b.alloc(x.kind, t); err != nil {
			return err
		}
	}
	per := t / int64(b.cfg.Pools)
	for range b.cfg.Pools {
		m, err := b.alloc(device.DeviceMemory, per)
		if err != nil {
			return err
		}
		b.pools = append(b.pools, m)
	}
	maxPages := t / int64(b.cfg.Pools) / slices.Min(b.cfg.Chunks)
	if b.idx, err = b.alloc(device.DeviceMemory, 2*maxPages*codec.PageIndexPairBytes); err != nil {
		return err
	}
	fmt.Fprintf(b.log, "generating %d MiB of fp16 data\n", t>>20)
	fillHalf(b.image.Host(), b.cfg.Seed)
	return b.restore()
}

// restore copies the image into the pools.
func (b *bench) restore() error {
	per := b.cfg.TotalBytes / int64(b.cfg.Pools)
	var descs []device.CopyDesc
	for p, m := range b.pools {
		descs = append(descs, device.CopyDesc{Dst: m.Ptr(), Src: b.image.Ptr().Add(int64(p) * per), Size: per})
	}
	if err := b.s.BatchCopy(descs); err != nil {
		return err
	}
	return b.s.Synchronize()
}

// readBack copies the pools into back.
func (b *bench) readBack() error {
	per := b.cfg.TotalBytes / int64(b.cfg.Pools)
	var descs []device.CopyDesc
	for p, m := range b.pools {
		descs = append(descs, device.CopyDesc{Dst: b.back.Ptr().Add(int64(p) * per), Src: m.Ptr(), Size: per})
	}
	if err := b.s.BatchCopy(descs); err != nil {
		return err
	}
	return b.s.Synchronize()
}

// timed runs submit between two timing events and returns the GPU time and
// the host time submit took.
func (b *bench) timed(submit func() error) (gpu, host time.Duration, err error) {
	if err := b.s.Record(b.a); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := submit(); err != nil {
		return 0, 0, err
	}
	host = time.Since(t0)
	if err := b.s.Record(b.b); err != nil {
		return 0, 0, err
	}
	if err := b.b.Synchronize(); err != nil {
		return 0, 0, err
	}
	gpu, err = cuda.ElapsedTime(b.a, b.b)
	return gpu, host, err
}

// series times fns interleaved (one run of each in turn, the order reversed
// every other round so that no function always follows the same one), after
// one warm-up round, and returns the median GPU and host times of each.
// Callers pass functions of one direction, so that every timed run follows
// a run of the same direction.
func (b *bench) series(fns ...func() error) (gpu, host []time.Duration, err error) {
	g := make([][]time.Duration, len(fns))
	h := make([][]time.Duration, len(fns))
	for r := 0; r <= b.cfg.Runs; r++ {
		for k := range fns {
			i := k
			if r%2 == 1 {
				i = len(fns) - 1 - k
			}
			gt, ht, err := b.timed(fns[i])
			if err != nil {
				return nil, nil, err
			}
			if r > 0 {
				g[i] = append(g[i], gt)
				h[i] = append(h[i], ht)
			}
		}
	}
	for i := range fns {
		gpu = append(gpu, stats.Median(g[i]))
		host = append(host, stats.Median(h[i]))
	}
	return gpu, host, nil
}

func (b *bench) gbs(d time.Duration) float64 { return float64(b.cfg.TotalBytes) / d.Seconds() / 1e9 }

// layoutFor is the hot pool group for chunk size c.
func (b *bench) layoutFor(c int64) layout.PoolGroupDesc {
	g := layout.PoolGroupDesc{Index: 0, NumSlots: b.cfg.TotalBytes / int64(b.cfg.Pools) / c, LifeCycles: []layout.LayerGroupID{0}}
	for _, m := range b.pools {
		g.Pools = append(g.Pools, layout.PoolDesc{Base: m.Ptr(), SlotBytes: c})
	}
	return g
}

func (b *bench) chunk(c int64) ([]Result, error) {
	t := b.cfg.TotalBytes
	n := int(t / int64(b.cfg.Pools) / c)
	// Contiguous limit, this chunk size's own measurement.
	d2h := func() error {
		return b.s.BatchCopy([]device.CopyDesc{{Dst: b.cold.Ptr(), Src: b.cont.Ptr(), Size: t}})
	}
	h2d := func() error {
		return b.s.BatchCopy([]device.CopyDesc{{Dst: b.cont.Ptr(), Src: b.cold.Ptr(), Size: t}})
	}
	limE, _, err := b.series(d2h)
	if err != nil {
		return nil, fmt.Errorf("contiguous limit: %w", err)
	}
	limD, _, err := b.series(h2d)
	if err != nil {
		return nil, fmt.Errorf("contiguous limit: %w", err)
	}
	limD2H, limH2D := b.gbs(limE[0]), b.gbs(limD[0])
	fmt.Fprintf(b.log, "chunk %s: %d pages of %d pools; contiguous limit D2H %.1f GB/s, H2D %.1f GB/s\n",
		size(c), n, b.cfg.Pools, limD2H, limH2D)

	r := rand.New(rand.NewPCG(b.cfg.Seed, uint64(c)))
	perm := r.Perm(n)
	enc := make([]codec.PageIndexPair, n)
	dec := make([]codec.PageIndexPair, n)
	for i, s := range perm {
		enc[i] = codec.PageIndexPair{Dst: int32(i), Src: int32(s)}
		dec[i] = codec.PageIndexPair{Dst: int32(s), Src: int32(i)}
	}
	var out []Result
	for _, name := range b.cfg.Codecs {
		res := Result{Codec: name, Chunk: c, Pools: b.cfg.Pools, Pages: n, LimitD2H: limD2H, LimitH2D: limH2D,
			PageBytes: c * int64(b.cfg.Pools)}
		var err error
		switch {
		case name == Default:
			err = b.runDefault(c, enc, dec, &res)
		default:
			err = b.runKernel(name, c, enc, dec, &res)
		}
		if err != nil {
			return out, fmt.Errorf("%s codec, chunk %s: %w", name, size(c), err)
		}
		fmt.Fprintf(b.log, "  %-7s enc %6.2f GB/s (%.3f of limit)  dec %6.2f GB/s (%.3f)\n",
			name, res.EncGBs, res.EncRatio(), res.DecGBs, res.DecRatio())
		out = append(out, res)
	}
	return out, nil
}

// verifyCold checks that cold page i holds slot perm(i) of every pool.
func (b *bench) verifyCold(c int64, enc []codec.PageIndexPair) error {
	per := b.cfg.TotalBytes / int64(b.cfg.Pools)
	img, cold := b.image.Host(), b.cold.Host()
	page := c * int64(b.cfg.Pools)
	return parallel(len(enc), func(i int) error {
		p := enc[i]
		for q := range b.cfg.Pools {
			want := img[int64(q)*per+int64(p.Src)*c:][:c]
			got := cold[int64(p.Dst)*page+int64(q)*c:][:c]
			if !bytes.Equal(want, got) {
				return fmt.Errorf("cold page %d, pool %d: differs from hot slot %d", p.Dst, q, p.Src)
			}
		}
		return nil
	})
}

// verifyHot checks that the pools equal the image again.
func (b *bench) verifyHot() error {
	if err := b.readBack(); err != nil {
		return err
	}
	img, back := b.image.Host(), b.back.Host()
	const piece = 1 << 20
	return parallel(len(img)/piece, func(i int) error {
		if !bytes.Equal(img[i*piece:(i+1)*piece], back[i*piece:(i+1)*piece]) {
			return fmt.Errorf("hot bytes [%d, %d) differ after decode", i*piece, (i+1)*piece)
		}
		return nil
	})
}

func (b *bench) poison() error {
	fillByte(b.cold.Host(), 0xee)
	for _, m := range b.pools {
		if err := b.s.Memset(m.Ptr(), 0xff, m.Size()); err != nil {
			return err
		}
	}
	return b.s.Synchronize()
}

func (b *bench) runDefault(c int64, enc, dec []codec.PageIndexPair, res *Result) error {
	cd := codec.NewDefault()
	defer codec.Destroy(cd)
	g := b.layoutFor(c)
	if !cd.Configure([]layout.PoolGroupDesc{g}) {
		return errors.New("configure failed")
	}
	res.ColdPageBytes = cd.QueryColdPageBytes(0)
	encIdx, decIdx := codec.HostIndices(enc), codec.HostIndices(dec)
	doEnc := func() error {
		if !cd.Encode(0, b.cold.Ptr(), encIdx, b.s) {
			return errors.New("encode failed")
		}
		return nil
	}
	doDec := func() error {
		if !cd.Decode(0, b.cold.Ptr(), decIdx, b.s) {
			return errors.New("decode failed")
		}
		return nil
	}
	if err := b.verifyLossless(c, enc, doEnc, doDec); err != nil {
		return err
	}
	res.Verified = !b.cfg.SkipVerify
	hl, err := codec.NewHotLayout([]layout.PoolGroupDesc{g})
	if err != nil {
		return err
	}
	encDescs, err := hl.AppendConcatCopies(nil, 0, codec.ToCold, b.cold.Ptr(), res.ColdPageBytes, enc)
	if err != nil {
		return err
	}
	decDescs, err := hl.AppendConcatCopies(nil, 0, codec.ToHot, b.cold.Ptr(), res.ColdPageBytes, dec)
	if err != nil {
		return err
	}
	// Raw references: the driver alone, on the same descriptors. "Built"
	// writes the driver's arrays from the pairs right before each call, as a
	// C++ codec does (the fair reference: building descriptors is part of
	// every codec call); "prebuilt" submits arrays built once, whose CPU
	// caches the call finds undisturbed.
	preEnc, preDec := cuda.NewRawBatch(encDescs), cuda.NewRawBatch(decDescs)
	var built cuda.RawBatch
	build := func(pairs []codec.PageIndexPair, toCold bool) *cuda.RawBatch {
		built.Reset()
		page := res.ColdPageBytes
		for _, p := range pairs {
			hot, cold := p.Src, p.Dst
			if !toCold {
				hot, cold = p.Dst, p.Src
			}
			cp := b.cold.Ptr().Add(int64(cold) * page)
			for _, pool := range g.Pools {
				hp := pool.Base.Add(int64(hot) * pool.SlotBytes)
				if toCold {
					built.Add(cp, hp, pool.SlotBytes)
				} else {
					built.Add(hp, cp, pool.SlotBytes)
				}
				cp = cp.Add(pool.SlotBytes)
			}
		}
		return &built
	}
	ge, he, err := b.series(doEnc,
		func() error { return b.s.SubmitRaw(build(enc, true)) },
		func() error { return b.s.SubmitRaw(preEnc) })
	if err != nil {
		return err
	}
	gd, hd, err := b.series(doDec,
		func() error { return b.s.SubmitRaw(build(dec, false)) },
		func() error { return b.s.SubmitRaw(preDec) })
	if err != nil {
		return err
	}
	res.EncGBs, res.RawEncGBs, res.PreEncGBs = b.gbs(ge[0]), b.gbs(ge[1]), b.gbs(ge[2])
	res.DecGBs, res.RawDecGBs, res.PreDecGBs = b.gbs(gd[0]), b.gbs(gd[1]), b.gbs(gd[2])
	res.EncSubmit, res.RawEncSubmit, res.PreEncSubmit = he[0], he[1], he[2]
	res.DecSubmit, res.RawDecSubmit, res.PreDecSubmit = hd[0], hd[1], hd[2]
	res.Units, res.UnitName = len(encDescs), "desc"
	return nil
}

// verifyLossless runs one encode and one decode and checks every byte.
func (b *bench) verifyLossless(c int64, enc []codec.PageIndexPair, doEnc, doDec func() error) error {
	if b.cfg.SkipVerify {
		return nil
	}
	if err := b.poison(); err != nil {
		return err
	}
	if err := b.restore(); err != nil {
		return err
	}
	if err := doEnc(); err != nil {
		return err
	}
	if err := b.s.Synchronize(); err != nil {
		return err
	}
	if err := b.verifyCold(c, enc); err != nil {
		return err
	}
	for _, m := range b.pools {
		if err := b.s.Memset(m.Ptr(), 0xff, m.Size()); err != nil {
			return err
		}
	}
	if err := doDec(); err != nil {
		return err
	}
	if err := b.s.Synchronize(); err != nil {
		return err
	}
	return b.verifyHot()
}

func (b *bench) runKernel(name string, c int64, enc, dec []codec.PageIndexPair, res *Result) (err error) {
	var cd codec.ColdPageCodec
	var qopts gpucodec.QuantOptions
	lossless := name != Quant
	if lossless {
		kernel := ""
		if _, v, ok := strings.Cut(name, ":"); ok {
			kernel = v
		}
		cd, err = gpucodec.NewGatherWith(b.dev, gpucodec.GatherOptions{Kernel: kernel})
	} else {
		var q *gpucodec.Quant
		q, err = gpucodec.NewQuant(b.dev, gpucodec.QuantOptions{Format: gpucodec.Float16})
		cd, qopts = q, q.Options()
	}
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, b.s.Synchronize(), codec.Destroy(cd))
	}()
	g := b.layoutFor(c)
	if !cd.Configure([]layout.PoolGroupDesc{g}) {
		return errors.New("configure failed")
	}
	res.ColdPageBytes = cd.QueryColdPageBytes(0)
	// Indices: enc pairs at the start of the index buffer, dec after them.
	n := len(enc)
	encBase, decBase := b.idx.Ptr(), b.idx.Ptr().Add(int64(n)*codec.PageIndexPairBytes)
	call := func(pairs []codec.PageIndexPair, base device.Ptr, fn func(device.Ptr, codec.PageIndices) bool) error {
		step := b.cfg.IndexChunkPairs
		for i := 0; i < len(pairs); i += step {
			j := min(i+step, len(pairs))
			at := base.Add(int64(i) * codec.PageIndexPairBytes)
			if err := b.s.CopyFromHost(at, pairBytes(pairs[i:j])); err != nil {
				return err
			}
			if !fn(b.cold.Ptr(), codec.DeviceIndices(at, j-i)) {
				return fmt.Errorf("codec call on pairs [%d, %d) failed", i, j)
			}
		}
		return nil
	}
	doEnc := func() error {
		return call(enc, encBase, func(p device.Ptr, ix codec.PageIndices) bool { return cd.Encode(0, p, ix, b.s) })
	}
	doDec := func() error {
		return call(dec, decBase, func(p device.Ptr, ix codec.PageIndices) bool { return cd.Decode(0, p, ix, b.s) })
	}
	if lossless {
		if err := b.verifyLossless(c, enc, doEnc, doDec); err != nil {
			return err
		}
	} else if !b.cfg.SkipVerify {
		if err := b.verifyQuant(qopts, doEnc, doDec, res); err != nil {
			return err
		}
	}
	res.Verified = !b.cfg.SkipVerify
	ge, he, err := b.series(doEnc)
	if err != nil {
		return err
	}
	gd, hd, err := b.series(doDec)
	if err != nil {
		return err
	}
	res.EncGBs, res.DecGBs = b.gbs(ge[0]), b.gbs(gd[0])
	res.EncSubmit, res.DecSubmit = he[0], hd[0]
	res.Units, res.UnitName = n, "page"
	if name == Quant {
		return b.restore() // decode left quantized values in the pools
	}
	return nil
}

// verifyQuant round-trips every page and checks every element against the
// error bound, and records the error statistics.
func (b *bench) verifyQuant(opts gpucodec.QuantOptions, doEnc, doDec func() error, res *Result) error {
	if err := b.poison(); err != nil {
		return err
	}
	if err := b.restore(); err != nil {
		return err
	}
	if err := doEnc(); err != nil {
		return err
	}
	for _, m := range b.pools {
		if err := b.s.Memset(m.Ptr(), 0xff, m.Size()); err != nil { // NaN: unwritten elements fail
			return err
		}
	}
	if err := doDec(); err != nil {
		return err
	}
	if err := b.s.Synchronize(); err != nil {
		return err
	}
	if err := b.readBack(); err != nil {
		return err
	}
	img, back := b.image.Host(), b.back.Host()
	be := opts.BlockElems
	blocks := len(img) / (2 * be)
	workers := runtime.GOMAXPROCS(0)
	maxs := make([]float64, workers)
	sums := make([]float64, workers)
	err := parallelN(workers, blocks, func(w, k int) error {
		o := img[2*be*k:][:2*be]
		d := back[2*be*k:][:2*be]
		var amax float64
		for i := range be {
			amax = max(amax, math.Abs(float64(opts.Format.ToFloat32(binary.LittleEndian.Uint16(o[2*i:])))))
		}
		for i := range be {
			x := float64(opts.Format.ToFloat32(binary.LittleEndian.Uint16(o[2*i:])))
			y := float64(opts.Format.ToFloat32(binary.LittleEndian.Uint16(d[2*i:])))
			e := math.Abs(y - x)
			if !(e <= gpucodec.ErrorBound(opts.Format, x, amax)) {
				return fmt.Errorf("block %d element %d: %g decoded as %g, beyond the error bound (block max %g)", k, i, x, y, amax)
			}
			if amax > 0 {
				maxs[w] = max(maxs[w], e/amax)
				sums[w] += (e / amax) * (e / amax)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var sum float64
	for w := range workers {
		res.MaxRelErr = max(res.MaxRelErr, maxs[w])
		sum += sums[w]
	}
	res.RMSRelErr = math.Sqrt(sum / float64(len(img)/2))
	return nil
}

func pairBytes(p []codec.PageIndexPair) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(p))), len(p)*codec.PageIndexPairBytes)
}

// parallel runs fn(i) for i in [0, n) on GOMAXPROCS goroutines and returns
// the first error.
func parallel(n int, fn func(i int) error) error {
	return parallelN(runtime.GOMAXPROCS(0), n, func(_, i int) error { return fn(i) })
}

func parallelN(workers, n int, fn func(w, i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := fn(w, i); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func fillByte(b []byte, v byte) {
	const piece = 1 << 22
	_ = parallel((len(b)+piece-1)/piece, func(i int) error {
		s := b[i*piece : min((i+1)*piece, len(b))]
		for j := range s {
			s[j] = v
		}
		return nil
	})
}

// fillHalf writes fp16 values: blocks of 128 elements with magnitudes from
// 2^-8 to 2^8, normally distributed within a block.
func fillHalf(b []byte, seed uint64) {
	const piece = 1 << 20
	_ = parallel(len(b)/piece, func(i int) error {
		r := rand.New(rand.NewPCG(seed, uint64(i)))
		s := b[i*piece : (i+1)*piece]
		var mag float64
		for e := 0; e < len(s)/2; e++ {
			if e%128 == 0 {
				mag = math.Ldexp(1, r.IntN(17)-8)
			}
			binary.LittleEndian.PutUint16(s[2*e:], gpucodec.Float16.FromFloat32(float32(r.NormFloat64()*mag)))
		}
		return nil
	})
}
