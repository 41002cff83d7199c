package fakeengine_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
	"github.com/kvcm/kvcm/internal/testkit/devicetest"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// setup describes a test rig.
type setup struct {
	tpb int
	// slots is the GPU quota in slots of the largest pool group page; zero
	// means plenty.
	slots        int64
	window       int // sliding window of layer 2; zero: full attention
	sinks        int
	partial      bool
	maxDelay     time.Duration
	seed         int64
	engine       fakeengine.Options
	maxUtil      float64
	noSlidingLyr bool
	// hostSlots and diskSlots add cold tiers of that many pages (of the hot
	// page size); half selects the codectest.Half codec instead of the
	// default one.
	hostSlots, diskSlots int64
	half                 bool
	diskDir              string
	// tweak, if set, edits the configuration last.
	tweak func(*config.Config)
}

// layers: layer 0 key/value 16 bytes a token each; layer 1 key 16, value 8
// (two pools); layer 2 key/value 8 with the window of the setup.
func (s setup) config() config.Config {
	tpb := int64(s.tpb)
	cfg := config.Config{
		TokensPerBlock: s.tpb,
		Layers: []config.AttentionLayerConfig{
			{LayerID: 0, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 16 * tpb}, {Role: config.RoleValue, Size: 16 * tpb}}},
			{LayerID: 1, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 16 * tpb}, {Role: config.RoleValue, Size: 8 * tpb}}},
		},
		EnablePartialReuse: s.partial,
		MaxUtilForResume:   s.maxUtil,
	}
	if !s.noSlidingLyr {
		cfg.Layers = append(cfg.Layers, config.AttentionLayerConfig{
			LayerID: 2, SlidingWindowSize: s.window, NumSinkTokens: s.sinks,
			Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 8 * tpb}, {Role: config.RoleValue, Size: 8 * tpb}},
		})
	}
	// A page of the full lifecycle is 56 bytes a token (layers 0, 1 and, with
	// no window, 2); of the windowed one 16.
	perTok := int64(56 + 16)
	slots := s.slots
	if slots == 0 {
		slots = 4096
	}
	cfg.CacheTiers = []config.CacheTierConfig{config.GPU(slots * perTok * tpb)}
	if s.hostSlots > 0 {
		cfg.CacheTiers = append(cfg.CacheTiers, config.Host(s.hostSlots*perTok*tpb))
	}
	if s.diskSlots > 0 {
		cfg.CacheTiers = append(cfg.CacheTiers, config.Disk(s.diskSlots*perTok*tpb, s.diskDir))
	}
	if s.tweak != nil {
		s.tweak(&cfg)
	}
	return cfg
}

type rig struct {
	t   *testing.T
	cfg config.Config
	dev device.Device // emu, or the backend KVCM_DEVICE names (devicetest)
	m   *core.Manager
	e   *fakeengine.Engine
}

func newRig(t *testing.T, s setup) *rig {
	t.Helper()
	if s.tpb == 0 {
		s.tpb = 16
	}
	if s.diskSlots > 0 {
		s.diskDir = t.TempDir()
	}
	r := &rig{t: t, cfg: s.config()}
	r.dev = devicetest.Open(t, emu.Options{Seed: s.seed, MaxDelay: s.maxDelay})
	opts := []core.Option{core.WithDevice(r.dev)}
	if s.half {
		opts = append(opts, core.WithColdPageCodec(codec.Own(codectest.NewHalf(r.dev))))
	}
	var err error
	r.m, err = core.NewManager(r.cfg, opts...)
	require.NoError(t, err)
	r.e, err = fakeengine.New(r.m, r.cfg, s.engine)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, r.e.Close())
		require.NoError(t, r.m.Close())
		require.NoError(t, r.dev.Close())
	})
	return r
}

func (r *rig) stream() device.Stream {
	r.t.Helper()
	s, err := r.dev.NewStream()
	require.NoError(r.t, err)
	r.t.Cleanup(func() { s.Close() })
	return s
}

// active creates a cache for prompt and resumes it on a new stream.
func (r *rig) active(prompt []config.Token) *core.KVCache {
	r.t.Helper()
	c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: prompt})
	require.NoError(r.t, err)
	require.NoError(r.t, c.Resume(r.stream()))
	return c
}

func (r *rig) lgOf(layer int32) layout.LayerGroupID {
	lg, err := r.m.LayerGroupOf(layer)
	require.NoError(r.t, err)
	return lg
}

// requireDrained asserts every slot of every level is free or evictable.
func (r *rig) requireDrained() {
	r.t.Helper()
	for level := range r.cfg.LocalTiers() {
		st, err := r.m.StorageStats(layout.CacheLevel(level))
		require.NoError(r.t, err)
		for _, g := range st {
			require.Equal(r.t, g.Total, g.Free+g.Evictable, "level %d pool group %d: %+v", level, g.Index, g)
		}
	}
}

func randTokens(rng *rand.Rand, n int) []config.Token {
	out := make([]config.Token, n)
	for i := range out {
		out[i] = config.Token(rng.IntN(50000))
	}
	return out
}

func concat(parts ...[]config.Token) []config.Token {
	var out []config.Token
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func isRetryable(err error) bool {
	return errors.Is(err, core.ErrOutOfPages) || errors.Is(err, core.ErrResumeRefused)
}
