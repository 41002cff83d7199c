// Package disk is `kvcm bench disk`: the disk tier's throughput beside the raw
// direct-I/O bandwidth of the same filesystem, measured in the same run.
//
// For each blob size it moves a fixed number of bytes through managers whose
// disk tier is on -dir: GPU→disk (a suspended cache pushed down by another
// one; durable: the time includes fsync of the blob files) and disk→GPU (the
// cache resumed after the page cache was told to drop the files), then
// host→disk (the host tier shrunk under a suspended cache's pages; the time
// the device spends reallocating the host tier, in its Alloc and Free calls,
// left out) and disk→host (a prefetch back), which time the disk tier's own
// I/O path without the device's copies. Beside them it writes and reads a scratch file
// of the same size with O_DIRECT at the same block size and the manager's
// queue depth, in sequential and in random block order (fsync included for
// writes), and prints host→disk and disk→host as ratios of the sequential raw
// figures (the tier fills its slots in ascending order). Where the
// filesystem refuses O_DIRECT (tmpfs) the raw figures are buffered and
// marked so.
//
// Each point is measured -reps times (default 3), the tier's runs and the raw
// runs interleaved, and every column is the median of its runs; the ratios
// are the medians of each run's tier figure over the raw figure of the same
// run, so a disturbance of the shared machine moves both sides of a ratio.
package disk

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/internal/bench/stats"
)

// QueueDepth is the raw I/O's queue depth: the manager's (core's
// diskQueueDepth).
const QueueDepth = 8

// Result is one blob size's figures, in GB/s (10^9 bytes per second), and
// the tier's host↔disk figures as ratios of the sequential raw ones.
type Result struct {
	BlobBytes                int64
	ToDisk, FromDisk         float64
	HostToDisk, DiskToHost   float64
	RawSeqWrite, RawRndWrite float64
	RawSeqRead, RawRndRead   float64
	WriteRatio, ReadRatio    float64
	Direct                   bool
}

// Main parses args, runs the benchmark and prints its table.
//
//	-dir D      directory of the disk tier and the raw file (default: the
//	            system's temporary directory)
//	-bytes N    bytes moved per blob size and direction, MiB (default 64)
//	-sizes L    blob sizes, KiB (default 16,64,256,1024,2048)
//	-reps R     runs per point, medians reported (default 3)
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench disk", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", os.TempDir(), "directory of the disk tier and the raw file")
	mib := fs.Int64("bytes", 64, "MiB moved per blob size and direction")
	var sizes sizeList = []int64{16, 64, 256, 1024, 2048}
	fs.Var(&sizes, "sizes", "blob sizes in KiB, comma-separated")
	reps := fs.Int("reps", 3, "runs per point, interleaved; medians are reported")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *reps < 1 {
		fmt.Fprintln(stderr, "bench disk: -reps must be at least 1")
		return 2
	}
	// On the emulation host memory is resident from Alloc, as pinned memory
	// is on CUDA, so no timing includes first-touch page faults.
	dev, err := backend.OpenWith("", backend.Options{Emu: emu.Options{ResidentHostMemory: true}})
	if err != nil {
		fmt.Fprintln(stderr, "bench disk:", err)
		return 1
	}
	defer dev.Close()
	fmt.Fprintf(stdout, "kvcm bench disk: %s, %d MiB per point, %d runs a point (medians), queue depth %d, device %s\n",
		*dir, *mib, *reps, QueueDepth, dev.Name())
	fmt.Fprintf(stdout, "%8s %9s %9s %9s %9s %9s %9s %9s %9s %8s %8s  %s\n",
		"blob", "gpu→disk", "disk→gpu", "host→disk", "disk→host", "raw-wseq", "raw-wrnd", "raw-rseq", "raw-rrnd",
		"h→d/raw", "d→h/raw", "raw")
	for _, kib := range sizes {
		r, err := Run(dev, *dir, kib<<10, *mib<<20, *reps)
		if err != nil {
			fmt.Fprintln(stderr, "bench disk:", err)
			return 1
		}
		mode := "O_DIRECT"
		if !r.Direct {
			mode = "buffered (no O_DIRECT here)"
		}
		fmt.Fprintf(stdout, "%6dKi %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f %8.2f  %s\n", kib,
			r.ToDisk, r.FromDisk, r.HostToDisk, r.DiskToHost, r.RawSeqWrite, r.RawRndWrite, r.RawSeqRead, r.RawRndRead,
			r.WriteRatio, r.ReadRatio, mode)
	}
	return 0
}

type sizeList []int64

func (s *sizeList) String() string { return fmt.Sprint(*s) }
func (s *sizeList) Set(v string) error {
	*s = nil
	for _, f := range splitComma(v) {
		var n int64
		if _, err := fmt.Sscan(f, &n); err != nil || n <= 0 {
			return fmt.Errorf("bad size %q", f)
		}
		*s = append(*s, n)
	}
	return nil
}

func splitComma(v string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(v); i++ {
		if i == len(v) || v[i] == ',' {
			out = append(out, v[start:i])
			start = i + 1
		}
	}
	return out
}

// Run measures one blob size, moving total bytes each way, reps times.
func Run(dev device.Device, dir string, blob, total int64, reps int) (Result, error) {
	n := max(total/blob, 1)
	runs := make([]Result, 0, reps)
	for range max(reps, 1) {
		r := Result{BlobBytes: blob}
		if err := runRaw(dir, blob, n, &r); err != nil {
			return r, fmt.Errorf("%d KiB raw I/O: %w", blob>>10, err)
		}
		var err error
		if r.HostToDisk, r.DiskToHost, err = runHost(dev, dir, blob, n); err != nil {
			return r, fmt.Errorf("%d KiB blobs between host and disk: %w", blob>>10, err)
		}
		if r.ToDisk, r.FromDisk, err = runTier(dev, dir, blob, n); err != nil {
			return r, fmt.Errorf("%d KiB blobs through the disk tier: %w", blob>>10, err)
		}
		r.WriteRatio, r.ReadRatio = r.HostToDisk/r.RawSeqWrite, r.DiskToHost/r.RawSeqRead
		runs = append(runs, r)
	}
	r := Result{BlobBytes: blob, Direct: runs[0].Direct}
	for _, f := range []func(r *Result) *float64{
		func(r *Result) *float64 { return &r.ToDisk }, func(r *Result) *float64 { return &r.FromDisk },
		func(r *Result) *float64 { return &r.HostToDisk }, func(r *Result) *float64 { return &r.DiskToHost },
		func(r *Result) *float64 { return &r.RawSeqWrite }, func(r *Result) *float64 { return &r.RawRndWrite },
		func(r *Result) *float64 { return &r.RawSeqRead }, func(r *Result) *float64 { return &r.RawRndRead },
		func(r *Result) *float64 { return &r.WriteRatio }, func(r *Result) *float64 { return &r.ReadRatio },
	} {
		v := make([]float64, len(runs))
		for i := range runs {
			v[i] = *f(&runs[i])
		}
		*f(&r) = stats.Median(v)
	}
	return r, nil
}

const tokensPerBlock = 16

func runTier(dev device.Device, dir string, blob, n int64) (toDisk, fromDisk float64, err error) {
	m, err := core.NewManager(tierConfig(dir, blob, n), core.WithDevice(dev))
	if err != nil {
		return 0, 0, err
	}
	defer m.Close()
	stream, err := dev.NewStream()
	if err != nil {
		return 0, 0, err
	}
	defer stream.Close()
	open := func(scope int64) (*core.KVCache, error) { return openCache(m, stream, scope, n) }
	a, err := open(1)
	if err != nil {
		return 0, 0, err
	}
	if err := a.Suspend(); err != nil {
		return 0, 0, err
	}
	bytes := float64(n * blob)

	start := time.Now()
	b, err := open(2) // pushes every page of A to disk
	if err == nil {
		err = stream.Synchronize()
	}
	if err == nil {
		err = syncFiles(dir, false)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("gpu→disk: %w", err)
	}
	toDisk = bytes / time.Since(start).Seconds() / 1e9
	if got := a.Residency()[1]; got != int(n) {
		return 0, 0, fmt.Errorf("gpu→disk: %d of %d pages on disk", got, n)
	}
	if err := b.Close(); err != nil {
		return 0, 0, err
	}
	if err := syncFiles(dir, true); err != nil {
		return 0, 0, err
	}

	start = time.Now()
	err = a.Resume(stream)
	if err == nil {
		err = stream.Synchronize()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("disk→gpu: %w", err)
	}
	fromDisk = bytes / time.Since(start).Seconds() / 1e9
	return toDisk, fromDisk, a.Close()
}

// runHost measures host→disk (the host tier shrunk to one page, so its
// pages fall to disk; durable) and disk→host (a prefetch back to the regrown
// host tier, page cache dropped first): the disk tier's I/O path without the
// device's copies. The shrink also reallocates the host tier (a new one-page
// allocation, the old one freed: cuMemFreeHost on CUDA, munmap on the
// emulation, 58–89 ms for 256 MiB on the development machine), which is no
// disk I/O: the time the device spends in those calls, measured by
// hostClock, is left out of host→disk.
func runHost(dev device.Device, dir string, blob, n int64) (toDisk, fromDisk float64, err error) {
	cfg := tierConfig(dir, blob, n)
	cfg.CacheTiers = []config.CacheTierConfig{cfg.CacheTiers[0], config.Host(n * blob), cfg.CacheTiers[1]}
	clock := &hostClock{Device: dev}
	m, err := core.NewManager(cfg, core.WithDevice(clock))
	if err != nil {
		return 0, 0, err
	}
	defer m.Close()
	stream, err := dev.NewStream()
	if err != nil {
		return 0, 0, err
	}
	defer stream.Close()
	a, err := openCache(m, stream, 1, n)
	if err != nil {
		return 0, 0, err
	}
	if err := a.Suspend(); err != nil {
		return 0, 0, err
	}
	b, err := openCache(m, stream, 2, n) // pushes A to the host tier
	if err != nil {
		return 0, 0, err
	}
	if err := b.Close(); err != nil {
		return 0, 0, err
	}
	if err := m.ResizeLevel(1, n*blob); err != nil { // drains
		return 0, 0, err
	}
	moved := float64((n - 1) * blob)

	start, realloc := time.Now(), clock.spent.Load()
	err = m.ResizeLevel(1, blob)
	if err == nil {
		err = syncFiles(dir, false)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("host→disk: %w", err)
	}
	elapsed := time.Since(start) - time.Duration(clock.spent.Load()-realloc)
	toDisk = moved / elapsed.Seconds() / 1e9
	if err := m.ResizeLevel(1, n*blob); err != nil {
		return 0, 0, err
	}
	if err := syncFiles(dir, true); err != nil {
		return 0, 0, err
	}

	start = time.Now()
	err = a.Prefetch(1)
	if err == nil {
		err = m.ResizeLevel(1, n*blob) // drains
	}
	if err != nil {
		return 0, 0, fmt.Errorf("disk→host: %w", err)
	}
	fromDisk = moved / time.Since(start).Seconds() / 1e9
	if got := a.Residency()[1]; got != int(n) {
		return 0, 0, fmt.Errorf("disk→host: %d of %d pages on the host tier", got, n)
	}
	return toDisk, fromDisk, a.Close()
}

// hostClock is a device whose host-mapped allocations count the time spent
// in their Alloc and Free calls (nanoseconds, in spent).
type hostClock struct {
	device.Device
	spent atomic.Int64
}

func (d *hostClock) Alloc(kind device.MemoryKind, size int64) (device.Memory, error) {
	if kind != device.HostMapped {
		return d.Device.Alloc(kind, size)
	}
	start := time.Now()
	mem, err := d.Device.Alloc(kind, size)
	d.spent.Add(int64(time.Since(start)))
	if err != nil {
		return nil, err
	}
	return clockedMemory{Memory: mem, d: d}, nil
}

type clockedMemory struct {
	device.Memory
	d *hostClock
}

func (m clockedMemory) Free() error {
	start := time.Now()
	err := m.Memory.Free()
	m.d.spent.Add(int64(time.Since(start)))
	return err
}

func tierConfig(dir string, blob, n int64) config.Config {
	// One layer whose key and value make a blob: the default codec's cold
	// page is the hot page.
	return config.Config{
		TokensPerBlock: tokensPerBlock,
		CacheTiers:     []config.CacheTierConfig{config.GPU(n * blob), config.Disk(n*blob, dir)},
		Layers: []config.AttentionLayerConfig{{LayerID: 0, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: blob / 2}, {Role: config.RoleValue, Size: blob / 2}}}},
	}
}

// openCache opens an active cache of n fresh blocks in scope.
func openCache(m *core.Manager, stream device.Stream, scope int64, n int64) (*core.KVCache, error) {
	tokens := int(n) * tokensPerBlock
	c, err := m.CreateKVCache(core.CacheOptions{Scope: blockhash.Scope{LoRAID: scope}, InputTokens: make([]config.Token, tokens)})
	if err != nil {
		return nil, err
	}
	if err := c.Resume(stream); err != nil {
		return nil, err
	}
	return c, c.Resize(tokens, 0)
}

// syncFiles makes the tier's blob files durable and, with drop, asks the
// kernel to drop them from the page cache so reads come from the disk.
func syncFiles(dir string, drop bool) error {
	names, err := filepath.Glob(filepath.Join(dir, "kvcm-group*-*.blob"))
	if err != nil {
		return err
	}
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			continue // another manager's, gone
		}
		err = f.Sync()
		if err == nil && drop {
			err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		}
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// runRaw writes and reads n blocks of blob bytes with O_DIRECT at
// QueueDepth, sequentially and in random order.
func runRaw(dir string, blob, n int64, r *Result) error {
	name := filepath.Join(dir, fmt.Sprintf(".kvcm-bench-raw-%d", os.Getpid()))
	defer os.Remove(name)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_DIRECT, 0o600)
	r.Direct = err == nil
	if errors.Is(err, syscall.EINVAL) {
		f, err = os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	// Allocated up front, as the disk tier's files are.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, n*blob); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	bufs := make([][]byte, QueueDepth)
	for i := range bufs {
		if bufs[i], err = unix.Mmap(-1, 0, int(blob), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
			return err
		}
		defer unix.Munmap(bufs[i])
		for j := range bufs[i] {
			bufs[i][j] = byte(j * (i + 1))
		}
	}
	seq := make([]int64, n)
	for i := range seq {
		seq[i] = int64(i)
	}
	rnd := append([]int64(nil), seq...)
	rand.New(rand.NewPCG(uint64(blob), uint64(n))).Shuffle(len(rnd), func(i, j int) { rnd[i], rnd[j] = rnd[j], rnd[i] })
	bytes := float64(n * blob)
	run := func(order []int64, write bool) (float64, error) {
		if !r.Direct {
			if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
				return 0, err
			}
		}
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make([]error, QueueDepth)
		for w := range QueueDepth {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= int64(len(order)) {
						return
					}
					var err error
					if write {
						_, err = f.WriteAt(bufs[w], order[i]*blob)
					} else {
						_, err = f.ReadAt(bufs[w], order[i]*blob)
					}
					if err != nil {
						errs[w] = err
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, err
		}
		if write {
			if err := f.Sync(); err != nil {
				return 0, err
			}
		}
		return bytes / time.Since(start).Seconds() / 1e9, nil
	}
	if r.RawSeqWrite, err = run(seq, true); err != nil {
		return err
	}
	if r.RawRndWrite, err = run(rnd, true); err != nil {
		return err
	}
	if r.RawSeqRead, err = run(seq, false); err != nil {
		return err
	}
	r.RawRndRead, err = run(rnd, false)
	return err
}
