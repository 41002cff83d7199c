package abimodel

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device/backend"
)

// DeviceKind is kvcm_device_kind: the device a manager allocates from.
type DeviceKind int32

// The device kinds, with the values of KVCM_DEVICE_*.
const (
	DeviceAuto DeviceKind = 0 // KVCM_DEVICE env, else CUDA where there is a GPU, else the emulation
	DeviceEmu  DeviceKind = 1
	DeviceCUDA DeviceKind = 2
)

// ManagerConfig is a manager's configuration as the ABI carries it
// (kvcm_manager_config): config.Config, and what the ABI holds in a form
// of its own. Resolve turns it into New's arguments. Its fields shadow
// config.Config's where the ABI's form differs (SwaScratchReuse is a flag
// here and a *config.SwaScratchReuseConfig there).
type ManagerConfig struct {
	config.Config
	Device             DeviceKind
	DeviceOrdinal      int
	EventQueueCapacity int
	// TypicalStepSystemPromptLength is typical_step's SystemPromptLength
	// (kvcm_batch_desc is frozen); non-zero needs a TypicalStep.
	TypicalStepSystemPromptLength int
	// ConstraintSystemPromptLengths are the constraints' SystemPromptLength:
	// none, or one per constraint.
	ConstraintSystemPromptLengths []int64
	// SharedTier, when not nil, is appended to the cache tiers.
	SharedTier *SharedTierConfig
	// DiskPersistent makes the last local tier (the disk tier, when there is
	// one) persistent.
	DiskPersistent bool
	// SwaScratchReuse enables SWA scratch reuse with SwaScratchMaxRewindLen.
	SwaScratchReuse        bool
	SwaScratchMaxRewindLen int
	// BufferTokensPerBlockOverrides are the TokensPerBlockOverride of every
	// buffer of every attention layer, in order: none, or one per buffer.
	BufferTokensPerBlockOverrides []int
	// GpuPoolGranularity is the GPU tier's PoolGranularity.
	GpuPoolGranularity int64
}

// SharedTierConfig is kvcm_shared_tier_config: a shared tier's settings in
// the ABI's units.
type SharedTierConfig struct {
	Addresses     string // comma-separated host:port
	KeyNamespace  string
	TTLMs         int64
	DialTimeoutMs int64
	CallTimeoutMs int64
	QueueBytes    int64
	WritePolicy   config.SharedWritePolicy
}

// tier converts the settings; config.Validate checks them, naming
// cache_tiers[i].<field> (the shared tier follows the local tiers).
func (s SharedTierConfig) tier() config.CacheTierConfig {
	var addrs []string
	if s.Addresses != "" {
		addrs = strings.Split(s.Addresses, ",")
	}
	ms := func(v int64) time.Duration { // saturating, so a huge value stays positive
		if v > math.MaxInt64/int64(time.Millisecond) {
			return math.MaxInt64
		}
		return time.Duration(v) * time.Millisecond
	}
	return config.Shared(config.SharedCacheTierConfig{
		Addresses:   addrs,
		Namespace:   s.KeyNamespace,
		TTL:         ms(s.TTLMs),
		DialTimeout: ms(s.DialTimeoutMs),
		CallTimeout: ms(s.CallTimeoutMs),
		QueueBytes:  s.QueueBytes,
		WritePolicy: s.WritePolicy,
	})
}

// Resolve returns the core configuration and New's options (without Codec
// and Registry). It changes nothing in c; errors name the
// kvcm_manager_config field.
func (c ManagerConfig) Resolve() (config.Config, Options, error) {
	cfg := c.Config
	cfg.CacheTiers = slices.Clone(cfg.CacheTiers)
	if c.SharedTier != nil {
		cfg.CacheTiers = append(cfg.CacheTiers, c.SharedTier.tier())
	}
	if c.SwaScratchReuse {
		cfg.SwaScratchReuse = &config.SwaScratchReuseConfig{MaxRewindLen: c.SwaScratchMaxRewindLen}
	}
	if len(cfg.CacheTiers) > 0 {
		cfg.CacheTiers[0].PoolGranularity = c.GpuPoolGranularity
	}
	if c.DiskPersistent {
		// On the last local tier: config.Validate names any but the disk
		// tier as cache_tiers[i].persistent.
		for i := len(cfg.CacheTiers) - 1; i >= 0; i-- {
			if cfg.CacheTiers[i].Kind != config.SharedTier {
				cfg.CacheTiers[i].Persistent = true
				break
			}
		}
	}
	switch {
	case cfg.TypicalStep != nil:
		step := *cfg.TypicalStep
		step.SystemPromptLength = c.TypicalStepSystemPromptLength
		cfg.TypicalStep = &step
	case c.TypicalStepSystemPromptLength != 0:
		return cfg, Options{}, argErr("config.typical_step_system_prompt_length", "is %d without a typical_step", c.TypicalStepSystemPromptLength)
	}
	if err := c.setBufferOverrides(&cfg); err != nil {
		return cfg, Options{}, err
	}
	if n := len(c.ConstraintSystemPromptLengths); n != 0 {
		if n != len(cfg.Constraints) {
			return cfg, Options{}, argErr("config.num_constraint_system_prompt_lengths", "is %d, want 0 or num_constraints (%d)", n, len(cfg.Constraints))
		}
		cfg.Constraints = slices.Clone(cfg.Constraints)
		for i, l := range c.ConstraintSystemPromptLengths {
			cfg.Constraints[i].SystemPromptLength = int(l)
		}
	}
	opts := Options{DeviceOrdinal: c.DeviceOrdinal, EventQueueCapacity: c.EventQueueCapacity}
	switch c.Device {
	case DeviceAuto:
		opts.Device = backend.Auto
	case DeviceEmu:
		opts.Device = backend.Emu
	case DeviceCUDA:
		opts.Device = backend.CUDA
	default:
		return cfg, Options{}, argErr("config.device", "unknown device kind %d", c.Device)
	}
	return cfg, opts, nil
}

// setBufferOverrides sets each buffer's TokensPerBlockOverride, copying the
// layers it changes.
func (c ManagerConfig) setBufferOverrides(cfg *config.Config) error {
	if len(c.BufferTokensPerBlockOverrides) == 0 {
		return nil
	}
	n := 0
	for _, l := range cfg.Layers {
		n += len(l.Buffers)
	}
	if len(c.BufferTokensPerBlockOverrides) != n {
		return argErr("config.num_buffer_tokens_per_block_overrides", "is %d, want 0 or the number of buffers of all layers (%d)", len(c.BufferTokensPerBlockOverrides), n)
	}
	cfg.Layers = slices.Clone(cfg.Layers)
	next := c.BufferTokensPerBlockOverrides
	for i := range cfg.Layers {
		bufs := slices.Clone(cfg.Layers[i].Buffers)
		for j := range bufs {
			bufs[j].TokensPerBlockOverride, next = next[0], next[1:]
		}
		cfg.Layers[i].Buffers = bufs
	}
	return nil
}

// DeviceKind is the kind of the device the manager opened: DeviceCUDA or
// DeviceEmu.
func (mgr *Manager) DeviceKind() DeviceKind {
	if mgr.DeviceName() == backend.CUDA {
		return DeviceCUDA
	}
	return DeviceEmu
}
