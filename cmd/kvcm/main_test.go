package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestDemoSmall(t *testing.T) {
	code, out, errOut := runCLI("demo", "--device", testDevice, "--groups", "3", "--per-group", "4", "--system-tokens", "200",
		"--question-tokens", "20", "--output-tokens", "5", "--tokens-per-block", "16", "--window", "64",
		"--gpu-quota", "512KiB", "--max-delay", "10us", "--seed", "7")
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	assert.Empty(t, errOut, "no progress bar when stderr is not a terminal")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	assert.Regexp(t, `^integrity: [1-9][0-9]* pages verified, 0 mismatches$`, last)
	assert.Contains(t, out, "requests served: 12\n")
	assert.Regexp(t, `evictions: [1-9][0-9]* pages`, out)

	// The same seed serves the same workload with the same outcome.
	code, again, _ := runCLI("demo", "--device", testDevice, "--groups", "3", "--per-group", "4", "--system-tokens", "200",
		"--question-tokens", "20", "--output-tokens", "5", "--tokens-per-block", "16", "--window", "64",
		"--gpu-quota", "512KiB", "--seed", "7")
	require.Equal(t, exitOK, code)
	strip := func(s string) string { // drop the timing line and the delay
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, "throughput:") && !strings.HasPrefix(l, "device:") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	assert.Equal(t, strip(out), strip(again))
}

func TestDemoDefaultsUseEveryMigrationPath(t *testing.T) {
	if testing.Short() {
		t.Skip("full demo")
	}
	code, out, errOut := runCLI("demo", "--device", testDevice)
	require.Equal(t, exitOK, code, errOut)
	for _, path := range []string{"gpu→host", "host→gpu", "gpu→disk", "disk→gpu", "host→disk", "disk→host", "gpu→gpu", "cold→cold"} {
		assert.Regexp(t, `\n  `+path+` +[1-9][0-9]* `, out, "path %s used", path)
	}
	assert.Regexp(t, `integrity: [1-9][0-9]* pages verified, 0 mismatches\n$`, out)
}

func TestDemoProgressAlways(t *testing.T) {
	code, out, errOut := runCLI("demo", "--device", testDevice, "--groups", "2", "--per-group", "2", "--system-tokens", "64",
		"--progress", "always")
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `serving +[0-9]+% \|.*\| \([0-4]/4, `, errOut, "the bar shows the count of requests")
	assert.True(t, strings.HasSuffix(errOut, "\r"), "and is erased at the end: %q", errOut)
	assert.Contains(t, out, "integrity:")
}

func TestUsageErrors(t *testing.T) {
	code, _, errOut := runCLI()
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "usage: kvcm <command>")

	code, _, errOut = runCLI("frobnicate")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, `unknown command "frobnicate"`)

	code, _, errOut = runCLI("demo", "--groups", "0")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--groups must be at least 1")

	code, _, errOut = runCLI("demo", "--gpu-quota", "lots")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, `invalid size "lots"`)

	code, _, errOut = runCLI("demo", "extra")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "unexpected arguments: extra")

	// A quota below the GPU pools' floors is raised to them (as in
	// KVCacheManagerV2), so the demo runs until a request no longer fits.
	code, _, errOut = runCLI("demo", "--device", testDevice, "--gpu-quota", "1KiB")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "out of pages")

	code, out, _ := runCLI("help", "demo")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "-gpu-quota")
	code, out, _ = runCLI("help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "demo ")
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"8388608": 8 << 20, "8MiB": 8 << 20, "8M": 8 << 20, "8mib": 8 << 20, "1.5GiB": 3 << 29,
		"512KB": 512000, "64 KiB": 64 << 10, "100b": 100,
	} {
		got, err := parseByteSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "MiB", "-1", "1.2.3", "8XB"} {
		_, err := parseByteSize(in)
		assert.Error(t, err, in)
	}
	assert.Equal(t, "8MiB", formatBytes(8<<20))
	assert.Equal(t, "1.5KiB", formatBytes(1536))
	assert.Equal(t, "100B", formatBytes(100))
}

func TestBenchMigrateOnTheEmulatedDevice(t *testing.T) {
	code, out, errOut := runCLI("bench", "migrate", "-on", "emu", "-total", "4MiB", "-chunks", "4KiB,64KiB", "-runs", "1")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "emulated device")
	assert.Regexp(t, `\| default \| 4 KiB × 4 \| 256 \| .* \| every byte \|`, out)
	assert.Regexp(t, `\| default \| 64 KiB × 4 \| 16 \| .* \| every byte \|`, out)

	code, _, errOut = runCLI("bench", "nothing")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "usage: kvcm bench migrate|bookkeeping")
}

// kvcm bench bookkeeping prints the trace's table and the decode-step table.
func TestBenchBookkeepingPrintsItsTables(t *testing.T) {
	code, out, errOut := runCLI("bench", "bookkeeping", "-prompts", "1k", "-requests", "2", "-rounds", "1", "-steps", "8", "-held", "1k,2k", "-window", "256")
	require.Equal(t, exitOK, code, errOut)
	for _, form := range []string{"per-step calls", "DecodeSteps, 1 token a call", "DecodeSteps, one call a block"} {
		assert.Contains(t, out, "| 1k | true | sha256 | "+form+" | ")
		assert.Contains(t, out, "| 1k | true | xxh3 | "+form+" | ")
		assert.Contains(t, out, "| full attention | "+form+" | 2k | ")
	}
}
