package abimodel

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device/backend"
)

// The shared tier follows the local tiers, in the core's units (comma-
// separated addresses split, milliseconds as durations, saturating), and
// disk_persistent marks the last local tier, never the shared one.
func TestResolveSharedTierAndPersistence(t *testing.T) {
	mc := ManagerConfig{Config: smallConfig(16), DiskPersistent: true, SharedTier: &SharedTierConfig{
		Addresses: "a:1,b:2", KeyNamespace: "ns", TTLMs: 1500, DialTimeoutMs: math.MaxInt64, QueueBytes: 7,
		WritePolicy: config.SharedWritePolicy(1),
	}}
	cfg, _, err := mc.Resolve()
	require.NoError(t, err)
	require.Len(t, cfg.CacheTiers, 3)
	sh := cfg.CacheTiers[2]
	assert.Equal(t, config.SharedTier, sh.Kind)
	assert.False(t, sh.Persistent)
	assert.True(t, cfg.CacheTiers[1].Persistent, "the last local tier")
	assert.Equal(t, config.SharedCacheTierConfig{Addresses: []string{"a:1", "b:2"}, Namespace: "ns", TTL: 1500 * time.Millisecond,
		DialTimeout: math.MaxInt64, QueueBytes: 7, WritePolicy: config.SharedWritePolicy(1)}, *sh.Shared)
	assert.Len(t, mc.CacheTiers, 2, "Resolve changes nothing in its receiver")
	assert.False(t, mc.CacheTiers[1].Persistent)
}

// The system prompt lengths and buffer overrides the ABI keeps in arrays
// of their own land on their batch and buffer; a length without a typical
// step, or an array of the wrong length, is an invalid argument naming the
// field, and Resolve changes nothing in its receiver.
func TestResolveSideArrays(t *testing.T) {
	base := smallConfig(16)
	base.TypicalStep = &config.BatchDesc{Requests: []config.RequestDesc{{Capacity: 8}}}
	base.Constraints = []config.BatchDesc{{Requests: []config.RequestDesc{{Capacity: 8}}}, {Requests: []config.RequestDesc{{Capacity: 4}}}}
	mc := ManagerConfig{Config: base, TypicalStepSystemPromptLength: 4, ConstraintSystemPromptLengths: []int64{1, 2},
		BufferTokensPerBlockOverrides: []int{0, 2, 4, 0}}
	cfg, _, err := mc.Resolve()
	require.NoError(t, err)
	assert.Equal(t, 4, cfg.TypicalStep.SystemPromptLength)
	assert.Equal(t, []int{1, 2}, []int{cfg.Constraints[0].SystemPromptLength, cfg.Constraints[1].SystemPromptLength})
	assert.Equal(t, 2, cfg.Layers[0].Buffers[1].TokensPerBlockOverride)
	assert.Equal(t, 4, cfg.Layers[1].Buffers[0].TokensPerBlockOverride)
	assert.Zero(t, base.TypicalStep.SystemPromptLength, "the receiver's batches are not changed")
	assert.Zero(t, base.Constraints[0].SystemPromptLength)
	assert.Zero(t, base.Layers[0].Buffers[1].TokensPerBlockOverride)

	for field, bad := range map[string]ManagerConfig{
		"config.typical_step_system_prompt_length":     {Config: smallConfig(16), TypicalStepSystemPromptLength: 4},
		"config.num_constraint_system_prompt_lengths":  {Config: base, ConstraintSystemPromptLengths: []int64{1}},
		"config.num_buffer_tokens_per_block_overrides": {Config: base, BufferTokensPerBlockOverrides: []int{1}},
		"config.device": {Config: base, Device: 9},
	} {
		_, _, err := bad.Resolve()
		assert.ErrorIs(t, err, core.ErrInvalidArgument, field)
		assert.ErrorContains(t, err, field)
	}
}

// swa_scratch_reuse turns SWA scratch reuse on with its rewind length; the
// device kinds select their backend.
func TestResolveScratchReuseAndDevice(t *testing.T) {
	cfg, opts, err := ManagerConfig{Config: smallConfig(16), SwaScratchReuse: true, SwaScratchMaxRewindLen: 12,
		Device: DeviceEmu, DeviceOrdinal: 1, EventQueueCapacity: 5}.Resolve()
	require.NoError(t, err)
	require.NotNil(t, cfg.SwaScratchReuse)
	assert.Equal(t, 12, cfg.SwaScratchReuse.MaxRewindLen)
	assert.Equal(t, Options{Device: backend.Emu, DeviceOrdinal: 1, EventQueueCapacity: 5}, opts)

	cfg, opts, err = ManagerConfig{Config: smallConfig(16), SwaScratchMaxRewindLen: 12}.Resolve()
	require.NoError(t, err)
	assert.Nil(t, cfg.SwaScratchReuse, "a rewind length alone enables nothing")
	assert.Equal(t, backend.Auto, opts.Device)
	_, opts, err = ManagerConfig{Config: smallConfig(16), Device: DeviceCUDA}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, backend.CUDA, opts.Device)
	assert.Equal(t, DeviceEmu, newManager(t, Options{}).DeviceKind(), "a manager reports the kind it opened")
}
