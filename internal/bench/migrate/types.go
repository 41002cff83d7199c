package migrate

import (
	"fmt"
	"strings"
	"time"
)

// Codec names.
const (
	Default = "default"
	Gather  = "gather"
	Quant   = "quant"
)

// Config is one benchmark run. Zero fields take the defaults.
type Config struct {
	TotalBytes      int64    // bytes moved per direction and run (duplex: down); 1 GiB
	DuplexUpBytes   int64    // duplex mode: bytes moved up while TotalBytes go down; TotalBytes
	Chunks          []int64  // bytes of one page in one pool; 4, 16, 64 KiB, 1 MiB
	Pools           int      // pools per page; 4
	Runs            int      // timed runs (median); 7
	Codecs          []string // Default, Gather (or "gather:KERNEL", a gpucodec.GatherKernels variant), Quant; all three
	IndexChunkPairs int      // pairs per index upload and kernel codec call; 8192 (64 KiB)
	Seed            uint64
	SkipVerify      bool
}

func (c *Config) fill() error {
	if c.TotalBytes == 0 {
		c.TotalBytes = 1 << 30
	}
	if c.DuplexUpBytes == 0 {
		c.DuplexUpBytes = c.TotalBytes
	}
	if len(c.Chunks) == 0 {
		c.Chunks = []int64{4 << 10, 16 << 10, 64 << 10, 1 << 20}
	}
	if c.Pools == 0 {
		c.Pools = 4
	}
	if c.Runs == 0 {
		c.Runs = 7
	}
	if len(c.Codecs) == 0 {
		c.Codecs = []string{Default, Gather, Quant}
	}
	if c.IndexChunkPairs == 0 {
		c.IndexChunkPairs = 8192
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	for _, ch := range c.Chunks {
		if ch <= 0 || ch%256 != 0 || c.TotalBytes%(int64(c.Pools)*ch) != 0 || c.DuplexUpBytes%(int64(c.Pools)*ch) != 0 {
			return fmt.Errorf("bench migrate: chunk %d must be a positive multiple of 256 dividing TotalBytes/Pools and DuplexUpBytes/Pools", ch)
		}
	}
	for _, n := range c.Codecs {
		if n != Default && n != Gather && n != Quant && n != Staged && !strings.HasPrefix(n, Gather+":") {
			return fmt.Errorf("bench migrate: unknown codec %q (want %s, %s, %s:KERNEL, %s or %s)", n, Default, Gather, Gather, Quant, Staged)
		}
	}
	if c.Pools <= 0 || c.Runs <= 0 || c.IndexChunkPairs <= 0 {
		return fmt.Errorf("bench migrate: pools, runs and index chunk must be positive")
	}
	return nil
}

// Result is one codec at one chunk size.
type Result struct {
	Codec string
	Chunk int64
	Pools int
	Pages int
	// EncGBs and DecGBs are hot bytes per second (TotalBytes / GPU time).
	EncGBs, DecGBs float64
	// LimitD2H and LimitH2D are the contiguous copy of TotalBytes, measured
	// for this chunk size in the same process.
	LimitD2H, LimitH2D float64
	// Units is what submit cost is counted per: descriptors (default codec)
	// or pages (kernel codecs).
	Units     int
	UnitName  string
	EncSubmit time.Duration // median host time of the submitting calls
	DecSubmit time.Duration
	// RawEncGBs and RawDecGBs (default codec only) are the same descriptors
	// submitted raw to the driver (cuda.RawBatch), the driver's arrays written
	// from the index pairs right before each call as a C++ codec would, and
	// RawEncSubmit/RawDecSubmit the host time of building and submitting.
	RawEncGBs, RawDecGBs       float64
	RawEncSubmit, RawDecSubmit time.Duration
	// PreEncGBs and PreDecGBs (default codec only) submit arrays built once
	// before timing: the driver call alone, with undisturbed CPU caches.
	PreEncGBs, PreDecGBs       float64
	PreEncSubmit, PreDecSubmit time.Duration
	// ColdPageBytes is the codec's cold page size (PCIe bytes per page).
	ColdPageBytes int64
	PageBytes     int64
	Verified      bool
	// MaxRelErr and RMSRelErr (quant) are |decoded-original| / block max.
	MaxRelErr, RMSRelErr float64
}

// EncRatio is encode GB/s over the D2H limit.
func (r Result) EncRatio() float64 { return r.EncGBs / r.LimitD2H }

// DecRatio is decode GB/s over the H2D limit.
func (r Result) DecRatio() float64 { return r.DecGBs / r.LimitH2D }

func size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
