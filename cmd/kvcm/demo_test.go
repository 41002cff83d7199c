package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device/cuda"
	"github.com/kvcm/kvcm/internal/testkit/devicetest"
)

// testDevice is the --device the demo tests pass: KVCM_DEVICE, or emu when
// it is unset (devicetest).
var testDevice = devicetest.Name()

func TestDemoDeviceAndCodecFlags(t *testing.T) {
	small := []string{"--groups", "2", "--per-group", "3", "--system-tokens", "96", "--question-tokens", "8",
		"--output-tokens", "3", "--tokens-per-block", "16", "--window", "32", "--gpu-quota", "256KiB", "--seed", "3"}
	demo := func(extra ...string) (int, string, string) {
		return runCLI(append(append([]string{"demo"}, extra...), small...)...)
	}
	code, auto, errOut := demo("--device", testDevice, "--codec", "auto")
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `integrity: [1-9][0-9]* pages verified, 0 mismatches\n$`, auto)
	resolved, err := devicetest.Resolved()
	require.NoError(t, err)
	if resolved == "cuda" {
		assert.Regexp(t, `\ndevice: cuda 0 \(`, auto)
		assert.Contains(t, auto, "codec: auto (layer group 0: staged, layer group 1: staged)", "2 KiB chunks: staged over the kernel")
		code, gather, errOut := demo("--device", testDevice, "--codec", "gather")
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, gather, "codec: auto (layer group 0: gather, layer group 1: gather)", "2 KiB chunks: the kernel without staging")
	} else {
		assert.Contains(t, auto, "device: emulated, max delay 0s; codec: auto (layer group 0: dma, layer group 1: dma)")
	}
	code, def, errOut := demo("--device", testDevice, "--codec", "default")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, def, "codec: default (DMA)")
	strip := func(s string) string {
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, "throughput:") && !strings.HasPrefix(l, "device:") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	assert.Equal(t, strip(def), strip(auto), "the codecs move the same pages with the same outcome")
	code, st, errOut := demo("--device", testDevice, "--codec", "staged")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, st, "codec: auto (layer group 0: staged, layer group 1: staged)", "2 KiB chunks: staged")
	assert.Equal(t, strip(def), strip(st), "the staged codec moves the same pages with the same outcome")

	code, _, errOut = demo("--device", "tpu")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--device must be auto, cuda or emu")
	code, _, errOut = demo("--codec", "zip")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--codec must be auto, gather, staged or default")
	if !cuda.Available() {
		code, _, errOut = demo("--device", "cuda")
		assert.Equal(t, exitFail, code)
		assert.Contains(t, errOut, "cuda")
		code, out, errOut := demo("--device", "auto")
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "device: emulated", "auto without a GPU is the emulation")
	}
}

// With --shared the second node reuses, through the cluster, the system
// prompts the first computed, and both verify every reused byte; it skips
// without KVCM_REDIS_CLUSTER.
func TestDemoSharedSecondNodeReusesFirstsPrefixes(t *testing.T) {
	addrs := os.Getenv("KVCM_REDIS_CLUSTER")
	if addrs == "" {
		t.Skip("KVCM_REDIS_CLUSTER is not set (scripts/redis-cluster.sh start; make test sets it)")
	}
	ns := fmt.Sprintf("demotest%d", time.Now().UnixNano())
	code, out, errOut := runCLI("demo", "--shared", addrs, "--shared-namespace", ns, "--device", testDevice,
		"--groups", "3", "--per-group", "2", "--system-tokens", "128", "--tokens-per-block", "16", "--progress", "never")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "node a: shared tier: 0 of")
	assert.Regexp(t, `node b: shared tier: 24 of \d+ blocks looked up found, 24 blocks`, out, "3 system prompts of 8 blocks")
	assert.Regexp(t, `node a: integrity: [1-9][0-9]* pages verified, 0 mismatches\n`, out)
	assert.Regexp(t, `node b: integrity: [1-9][0-9]* pages verified, 0 mismatches\n$`, out)

	code, _, errOut = runCLI("demo", "--shared", addrs, "--shared-node", "c")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--shared-node")
}
