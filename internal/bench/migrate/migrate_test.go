package migrate

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec/staged"
	"github.com/kvcm/kvcm/core/device/cuda"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "4KiB": 4096, "16K": 16384, "1MiB": 1 << 20, "1GiB": 1 << 30, " 64 KiB": 65536} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "x", "-4K", "0"} {
		_, err := ParseSize(bad)
		assert.Error(t, err, bad)
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	WriteTable(&b, []TableRow{
		Result{Codec: Default, Chunk: 4096, Pools: 4, Pages: 10, EncGBs: 8, DecGBs: 2.5, LimitD2H: 55, LimitH2D: 54,
			Units: 40, UnitName: "desc", RawEncGBs: 8.1, RawDecGBs: 2.5, PageBytes: 16384, ColdPageBytes: 16384, Verified: true}.Row(),
		Result{Codec: Quant, Chunk: 1 << 20, Pools: 4, Pages: 1, EncGBs: 90, DecGBs: 80, LimitD2H: 55, LimitH2D: 54,
			Units: 1, UnitName: "page", PageBytes: 4 << 20, ColdPageBytes: 2 << 20, Verified: true, MaxRelErr: 0.06, RMSRelErr: 0.01}.Row(),
	})
	out := b.String()
	assert.Contains(t, out, "| default | 4 KiB × 4 | 10 | 8.00 | 2.50 | 55.0 / 54.0 | 0.145 | 0.046 |")
	assert.Contains(t, out, "0.988, 1.000")
	assert.Contains(t, out, "quant 1 MiB: max |err|/block max 0.0600")
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	c := Config{}
	require.NoError(t, c.fill())
	assert.EqualValues(t, 1<<30, c.TotalBytes)
	assert.Equal(t, []string{Default, Gather, Quant}, c.Codecs)
	bad := Config{Chunks: []int64{1000}}
	assert.Error(t, bad.fill())
	bad = Config{Codecs: []string{"zip"}}
	assert.Error(t, bad.fill())
}

func TestMainWithoutGPU(t *testing.T) {
	if cuda.Available() {
		t.Skip("a GPU is present")
	}
	var out, errb bytes.Buffer
	assert.Equal(t, 1, Main([]string{"-on", "cuda", "-total", "16MiB"}, &out, &errb), "cuda demanded: a clean failure")
	assert.Contains(t, errb.String(), "no usable CUDA")
	assert.Equal(t, 2, Main([]string{"-chunks", "x"}, &out, &errb))
	assert.Equal(t, 2, Main([]string{"-on", "tpu"}, &out, &errb))

	out.Reset()
	errb.Reset()
	require.Equal(t, 0, Main([]string{"-total", "4MiB", "-chunks", "64KiB", "-runs", "1"}, &out, &errb), errb.String())
	assert.Contains(t, errb.String(), "measuring the default codec on the emulated device")
	assert.Regexp(t, `\| default \| 64 KiB × 4 \| 16 \| .* \| every byte \|`, out.String())
}

// A small run on the GPU: every codec verified at two chunk sizes.
func TestSmallRunOnGPU(t *testing.T) {
	if !cuda.Available() {
		t.Skip("no usable CUDA GPU")
	}
	var out, errb bytes.Buffer
	code := Main([]string{"-total", "32MiB", "-chunks", "4KiB,64KiB", "-runs", "2"}, &out, &errb)
	t.Log(errb.String())
	t.Log(out.String())
	require.Equal(t, 0, code)
	assert.Contains(t, out.String(), "| gather | 64 KiB × 4 |")
	_ = errors.New
}

// Duplex mode on the emulated device: both codecs move every byte of both
// directions at once, and the table prints the aggregate beside the
// two-stream limit with their ratio.
func TestDuplexModeOnEmu(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main([]string{"-duplex", "-on", "emu", "-total", "2MiB", "-up", "1MiB", "-chunks", "4KiB,64KiB", "-runs", "1",
		"-stage-chunk", "256KiB"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, out.String(), "| duplex GB/s | two-stream limit GB/s | duplex / limit |")
	assert.Regexp(t, `\| default \| 4 KiB × 4 \| 128 / 64 \| .* \| every byte \|`, out.String())
	assert.Regexp(t, `\| staged \| 64 KiB × 4 \| 8 / 4 \| .* \| every byte \|`, out.String())
	assert.Equal(t, 2, Main([]string{"-duplex", "-on", "emu", "-up", "x"}, &out, &errb))
	assert.Equal(t, 2, Main([]string{"-codecs", "staged", "-on", "emu"}, &out, &errb), "staged is a duplex-mode codec")
}

// Duplex mode refuses a lossy codec and an up size no chunk divides.
func TestDuplexConfigValidation(t *testing.T) {
	_, _, err := RunDuplexEmu(Config{TotalBytes: 1 << 20, Chunks: []int64{4096}, Codecs: []string{Quant}, Runs: 1},
		staged.Options{}, io.Discard)
	assert.ErrorContains(t, err, "quant")
	bad := Config{TotalBytes: 1 << 20, DuplexUpBytes: 3 * 4096, Chunks: []int64{4096}}
	assert.ErrorContains(t, bad.fill(), "DuplexUpBytes")
}
