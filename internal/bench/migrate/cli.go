package migrate

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kvcm/kvcm/core/codec/staged"
	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/internal/bench/cpuprofile"
)

// Main is `kvcm bench migrate`: it parses args, runs the benchmark on the
// chosen device (a CUDA GPU when there is one, else the emulated device) and
// prints the table last. It returns the process exit code.
//
//	-on NAME        cuda, emu or auto (default auto)
//	-total SIZE     bytes moved per direction and run (default 1GiB)
//	-chunks LIST    chunk sizes, comma-separated (default 4KiB,16KiB,64KiB,1MiB)
//	-pools N        pools per page (default 4)
//	-runs N         timed runs, median reported (default 7)
//	-codecs LIST    default,gather,quant (default all); gather:KERNEL picks a
//	                gpucodec.GatherKernels variant
//	-index-chunk N  index pairs per kernel codec call (default 8192, 64 KiB)
//	-device N       CUDA device ordinal (default 0)
//	-json FILE      also write the results as JSON
//	-no-verify      skip the byte verification (not for recorded results)
//	-duplex         duplex mode: -total goes down (encode, GPU→host) on one
//	                stream while -up comes up (decode) on another, beside the
//	                two-stream contiguous DMA limit and each direction alone
//	                (codecs default,gather,staged on CUDA, default,staged on emu)
//	-up SIZE        duplex mode: bytes moved up (default: -total)
//	-stage-chunk SIZE  the staged codec's DMA chunk (default: the codec's,
//	                staged.DefaultChunkBytes)
//	-stage-ring N   the staged codec's device ring per stream, in chunks
//	                (default: the codec's, staged.DefaultRingChunks)
//	-stage-serial   the staged codec's DMA on the caller's stream, after each
//	                chunk's gather (default: on a copy stream, pipelined)
//	-cpuprofile F   write a CPU profile of the whole run to F (go tool pprof)
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	total := fs.String("total", "1GiB", "bytes moved per direction and run")
	chunks := fs.String("chunks", "4KiB,16KiB,64KiB,1MiB", "chunk sizes (bytes of one page in one pool)")
	pools := fs.Int("pools", 4, "pools per page")
	runs := fs.Int("runs", 7, "timed runs (median reported)")
	codecs := fs.String("codecs", "default,gather,quant", "codecs to measure")
	ordinal := fs.Int("device", 0, "CUDA device ordinal")
	jsonOut := fs.String("json", "", "also write the results as JSON to this file")
	indexChunk := fs.Int("index-chunk", 8192, "index pairs per kernel codec call")
	noVerify := fs.Bool("no-verify", false, "skip verifying the copied bytes")
	on := fs.String("on", "auto", "device: cuda, emu, or auto (cuda when a GPU is present)")
	duplex := fs.Bool("duplex", false, "move -total down while -up comes up, on two streams")
	up := fs.String("up", "", "duplex mode: bytes moved up (default: -total)")
	stageChunk := fs.String("stage-chunk", "", "the staged codec's DMA chunk (default: the codec's default)")
	stageRing := fs.Int("stage-ring", 0, "the staged codec's device ring per stream, in chunks (default: the codec's default)")
	stageSerial := fs.Bool("stage-serial", false, "the staged codec's DMA on the caller's stream (not pipelined)")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	stop, err := cpuprofile.Start(*profile)
	if err != nil {
		fmt.Fprintln(stderr, "bench migrate:", err)
		return 2
	}
	defer stop()
	codecsSet := false
	fs.Visit(func(f *flag.Flag) { codecsSet = codecsSet || f.Name == "codecs" })
	cfg := Config{Pools: *pools, Runs: *runs, SkipVerify: *noVerify, IndexChunkPairs: *indexChunk}
	if cfg.TotalBytes, err = ParseSize(*total); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	for _, c := range strings.Split(*chunks, ",") {
		n, err := ParseSize(c)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		cfg.Chunks = append(cfg.Chunks, n)
	}
	for _, c := range strings.Split(*codecs, ",") {
		cfg.Codecs = append(cfg.Codecs, strings.TrimSpace(c))
	}
	if *duplex {
		stage := staged.Options{Serial: *stageSerial, RingChunks: *stageRing}
		if *stageChunk != "" {
			if stage.ChunkBytes, err = ParseSize(*stageChunk); err != nil {
				fmt.Fprintln(stderr, "bench migrate: -stage-chunk:", err)
				return 2
			}
		}
		if stage.RingChunks < 0 {
			fmt.Fprintf(stderr, "bench migrate: -stage-ring %d must not be negative\n", stage.RingChunks)
			return 2
		}
		return mainDuplex(cfg, *up, stage, codecsSet, *on, *ordinal, *jsonOut, stdout, stderr)
	}
	for _, c := range cfg.Codecs {
		if c == Staged {
			fmt.Fprintln(stderr, "bench migrate: the staged codec is measured in -duplex mode (which reports each direction alone too)")
			return 2
		}
	}
	var res []Result
	var header string
	switch *on {
	case "cuda":
		res, header, err = runOnGPU(*ordinal, cfg, stderr)
	case "emu":
		cfg.Codecs = []string{Default}
		res, header, err = RunEmu(cfg, stderr)
	case "auto":
		if res, header, err = runOnGPU(*ordinal, cfg, stderr); errors.Is(err, cuda.ErrUnavailable) {
			fmt.Fprintln(stderr, "bench migrate: no CUDA GPU; measuring the default codec on the emulated device")
			cfg.Codecs = []string{Default}
			res, header, err = RunEmu(cfg, stderr)
		}
	default:
		fmt.Fprintf(stderr, "bench migrate: -on must be cuda, emu or auto, got %q\n", *on)
		return 2
	}
	if len(res) > 0 {
		if *jsonOut != "" {
			if b, jerr := json.MarshalIndent(res, "", "  "); jerr == nil {
				jerr = os.WriteFile(*jsonOut, b, 0o644)
				if jerr != nil {
					fmt.Fprintln(stderr, jerr)
				}
			}
		}
		fmt.Fprintln(stdout, header)
		rows := make([]TableRow, len(res))
		for i, r := range res {
			rows[i] = r.Row()
		}
		WriteTable(stdout, rows)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench migrate:", err)
		return 1
	}
	return 0
}

// ParseSize reads "4096", "4KiB", "4K", "16MiB", "1GiB" (binary units).
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// mainDuplex is Main's -duplex mode.
func mainDuplex(cfg Config, up string, stage staged.Options, codecsSet bool, on string, ordinal int, jsonOut string, stdout, stderr io.Writer) int {
	var err error
	if up != "" {
		if cfg.DuplexUpBytes, err = ParseSize(up); err != nil {
			fmt.Fprintln(stderr, "bench migrate: -up:", err)
			return 2
		}
	}
	emuRun := func() ([]DuplexResult, string, error) {
		if !codecsSet {
			cfg.Codecs = []string{Default, Staged}
		}
		return RunDuplexEmu(cfg, stage, stderr)
	}
	if !codecsSet {
		cfg.Codecs = []string{Default, Gather, Staged}
	}
	var res []DuplexResult
	var header string
	switch on {
	case "cuda":
		res, header, err = runDuplexOnGPU(ordinal, cfg, stage, stderr)
	case "emu":
		res, header, err = emuRun()
	case "auto":
		if res, header, err = runDuplexOnGPU(ordinal, cfg, stage, stderr); errors.Is(err, cuda.ErrUnavailable) {
			fmt.Fprintln(stderr, "bench migrate: no CUDA GPU; duplex mode on the emulated device")
			res, header, err = emuRun()
		}
	default:
		fmt.Fprintf(stderr, "bench migrate: -on must be cuda, emu or auto, got %q\n", on)
		return 2
	}
	if len(res) > 0 {
		if jsonOut != "" {
			if b, jerr := json.MarshalIndent(res, "", "  "); jerr == nil {
				if jerr = os.WriteFile(jsonOut, b, 0o644); jerr != nil {
					fmt.Fprintln(stderr, jerr)
				}
			}
		}
		fmt.Fprintln(stdout, header)
		WriteDuplexTable(stdout, res)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench migrate:", err)
		return 1
	}
	return 0
}
