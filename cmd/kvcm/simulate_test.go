package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSimulateSmall(t *testing.T) {
	args := []string{"simulate", "--workloads", "w2:0.8:0.25,w5", "--shrink", "16", "--seeds", "2", "--loads", "0.9",
		"--policies", "fcfs,window:8"}
	code, out, errOut := runCLI(args...)
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	assert.Empty(t, errOut, "no progress bar when stderr is not a terminal")
	assert.Contains(t, out, "== w2:0.8:0.25: 256 requests")
	assert.Contains(t, out, "window:8")

	code, out, _ = runCLI(append(args, "--json")...)
	require.Equal(t, exitOK, code)
	var rep struct {
		Workloads []struct {
			Name   string
			Points []struct{ Policy string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Workloads, 2)
	assert.Len(t, rep.Workloads[0].Points, 2)

	code, _, errOut = runCLI("simulate", "--policies", "lifo")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "unknown policy")
	code, _, _ = runCLI("simulate", "--progress", "sometimes")
	assert.Equal(t, exitUsage, code)
}
