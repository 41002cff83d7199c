package migrate

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/bench/stats"
)

// RunEmu measures the default codec on the emulated device, where a copy is a
// host memmove: the same layout, permutation and verification as Run, timed
// with the wall clock around each call and its Synchronize. Kernel codecs need
// a GPU and are skipped. Emulated figures compare codecs and bookkeeping on
// one machine; only a GPU gives PCIe numbers.
func RunEmu(cfg Config, log io.Writer) ([]Result, string, error) {
	if err := cfg.fill(); err != nil {
		return nil, "", err
	}
	if !slices.Contains(cfg.Codecs, Default) {
		return nil, "", fmt.Errorf("bench migrate: the emulated device runs the %s codec only", Default)
	}
	dev := emu.New(emu.Options{})
	defer dev.Close()
	s, err := dev.NewStream()
	if err != nil {
		return nil, "", err
	}
	defer s.Close()
	hot := make([]device.Memory, cfg.Pools)
	for i := range hot {
		if hot[i], err = dev.Alloc(device.DeviceMemory, cfg.TotalBytes/int64(cfg.Pools)); err != nil {
			return nil, "", err
		}
		defer hot[i].Free()
	}
	cold, err := dev.Alloc(device.HostMapped, cfg.TotalBytes)
	if err != nil {
		return nil, "", err
	}
	defer cold.Free()
	header := fmt.Sprintf("kvcm bench migrate: emulated device (host memmove), %d MiB per run, median of %d runs, wall clock",
		cfg.TotalBytes>>20, cfg.Runs)
	var out []Result
	for _, c := range cfg.Chunks {
		fmt.Fprintf(log, "bench migrate: emu, default codec, chunk %s\n", size(c))
		r, err := emuChunk(dev, s, hot, cold, cfg, c)
		if err != nil {
			return out, header, err
		}
		out = append(out, r)
	}
	return out, header, nil
}

func emuChunk(dev *emu.Device, s device.Stream, hot []device.Memory, cold device.Memory, cfg Config, chunk int64) (Result, error) {
	pages := int(cfg.TotalBytes / (int64(cfg.Pools) * chunk))
	desc := layout.PoolGroupDesc{Index: 0, NumSlots: int64(pages), LifeCycles: []layout.LayerGroupID{0}}
	for _, m := range hot {
		desc.Pools = append(desc.Pools, layout.PoolDesc{Base: m.Ptr(), SlotBytes: chunk})
	}
	cc := codec.NewDefault()
	defer codec.Destroy(cc)
	if !cc.Configure([]layout.PoolGroupDesc{desc}) {
		return Result{}, fmt.Errorf("bench migrate: default codec rejected the layout")
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(chunk)))
	enc := make([]codec.PageIndexPair, pages)
	dec := make([]codec.PageIndexPair, pages)
	for i, slot := range rng.Perm(pages) {
		enc[i] = codec.PageIndexPair{Dst: int32(i), Src: int32(slot)}
		dec[i] = codec.PageIndexPair{Dst: int32(slot), Src: int32(i)}
	}
	r := Result{Codec: Default, Chunk: chunk, Pools: cfg.Pools, Pages: pages, Units: pages * cfg.Pools,
		UnitName: "descriptor", ColdPageBytes: cc.QueryColdPageBytes(0), PageBytes: desc.PageBytes()}
	encode := func() bool { return cc.Encode(0, cold.Ptr(), codec.HostIndices(enc), s) }
	decode := func() bool { return cc.Decode(0, cold.Ptr(), codec.HostIndices(dec), s) }
	if !cfg.SkipVerify {
		if err := emuVerify(dev, s, hot, cold, desc, enc, encode, decode); err != nil {
			return r, err
		}
		r.Verified = true
	}
	var err error
	if r.EncGBs, r.EncSubmit, err = emuTime(s, cfg, encode); err != nil {
		return r, err
	}
	if r.DecGBs, r.DecSubmit, err = emuTime(s, cfg, decode); err != nil {
		return r, err
	}
	// The limit: the same bytes as one contiguous copy per pool.
	per := cfg.TotalBytes / int64(cfg.Pools)
	contiguous := func(toCold bool) func() bool {
		descs := make([]device.CopyDesc, len(hot))
		for i, m := range hot {
			descs[i] = device.CopyDesc{Dst: cold.Ptr().Add(int64(i) * per), Src: m.Ptr(), Size: per}
			if !toCold {
				descs[i].Dst, descs[i].Src = descs[i].Src, descs[i].Dst
			}
		}
		return func() bool { return s.BatchCopy(descs) == nil }
	}
	if r.LimitD2H, _, err = emuTime(s, cfg, contiguous(true)); err != nil {
		return r, err
	}
	if r.LimitH2D, _, err = emuTime(s, cfg, contiguous(false)); err != nil {
		return r, err
	}
	return r, nil
}

// emuTime returns GB/s of TotalBytes and the median host time of the
// submitting call.
func emuTime(s device.Stream, cfg Config, submit func() bool) (float64, time.Duration, error) {
	var wall, host []time.Duration
	for range cfg.Runs + 1 {
		start := time.Now()
		if !submit() {
			return 0, 0, fmt.Errorf("bench migrate: submission failed")
		}
		submitted := time.Now()
		if err := s.Synchronize(); err != nil {
			return 0, 0, err
		}
		wall = append(wall, time.Since(start))
		host = append(host, submitted.Sub(start))
	}
	wall, host = wall[1:], host[1:] // the first run warms up
	return float64(cfg.TotalBytes) / stats.Median(wall).Seconds() / 1e9, stats.Median(host), nil
}

// emuVerify encodes once and checks every cold byte against the scattered
// hot slots, then poisons the hot pools, decodes and checks every hot byte.
func emuVerify(dev *emu.Device, s device.Stream, hot []device.Memory, cold device.Memory, desc layout.PoolGroupDesc,
	enc []codec.PageIndexPair, encode, decode func() bool) error {
	stage, err := dev.Alloc(device.HostMapped, int64(len(hot))*hot[0].Size())
	if err != nil {
		return err
	}
	defer stage.Free()
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range stage.Host() {
		stage.Host()[i] = byte(rng.Uint32())
	}
	want := bytes.Clone(stage.Host())
	moveAll := func(toHot bool) error {
		var descs []device.CopyDesc
		for i, m := range hot {
			d := device.CopyDesc{Dst: stage.Ptr().Add(int64(i) * m.Size()), Src: m.Ptr(), Size: m.Size()}
			if toHot {
				d.Dst, d.Src = d.Src, d.Dst
			}
			descs = append(descs, d)
		}
		if err := s.BatchCopy(descs); err != nil {
			return err
		}
		return s.Synchronize()
	}
	if err := moveAll(true); err != nil {
		return err
	}
	if !encode() || s.Synchronize() != nil {
		return fmt.Errorf("bench migrate: encode failed")
	}
	page := desc.PageBytes()
	for _, p := range enc {
		off := int64(0)
		for i, pool := range desc.Pools {
			got := cold.Host()[int64(p.Dst)*page+off : int64(p.Dst)*page+off+pool.SlotBytes]
			src := want[int64(i)*hot[i].Size()+int64(p.Src)*pool.SlotBytes:][:pool.SlotBytes]
			if !bytes.Equal(got, src) {
				return fmt.Errorf("bench migrate: cold page %d pool %d differs from hot slot %d", p.Dst, i, p.Src)
			}
			off += pool.SlotBytes
		}
	}
	clear(stage.Host())
	if err := moveAll(true); err != nil {
		return err
	}
	if !decode() || s.Synchronize() != nil {
		return fmt.Errorf("bench migrate: decode failed")
	}
	if err := moveAll(false); err != nil {
		return err
	}
	if !bytes.Equal(stage.Host(), want) {
		return fmt.Errorf("bench migrate: decoded hot pools differ from the original")
	}
	return nil
}
