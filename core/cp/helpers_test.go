package cp

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/emu"
)

const tpb = 4

// tinyConfig: one full-attention layer of 8 bytes a block, `slots` pages.
func tinyConfig(slots int64) config.Config {
	return config.Config{
		TokensPerBlock:   tpb,
		CacheTiers:       []config.CacheTierConfig{config.GPU(slots * 8)},
		Layers:           []config.AttentionLayerConfig{{LayerID: 0, Buffers: []config.BufferConfig{{Role: config.RoleKey, Size: 8}}}},
		MaxUtilForResume: 1,
	}
}

type rig struct {
	t      *testing.T
	m      *core.Manager
	x      *ManagerBacked
	stream device.Stream
	events *eventLog
}

type eventLog struct {
	mu  sync.Mutex
	evs []core.CacheEvent
}

func (l *eventLog) listener() core.EventListener {
	return func(e core.CacheEvent) {
		l.mu.Lock()
		l.evs = append(l.evs, e)
		l.mu.Unlock()
	}
}

func (l *eventLog) stored() []blockhash.Key {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []blockhash.Key
	for _, e := range l.evs {
		if e.Kind == core.BlockStored {
			out = append(out, e.Key)
		}
	}
	return out
}

func newRig(t *testing.T, cfg config.Config, opts ManagerBackedOptions) *rig {
	t.Helper()
	dev := emu.New(emu.Options{Seed: 1})
	log := &eventLog{}
	m, x, err := NewManagerWithIndex(cfg, opts, core.WithDevice(dev), core.WithEventListener(log.listener()))
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		m.Close()
		dev.Close()
	})
	return &rig{t: t, m: m, x: x, stream: s, events: log}
}

func seq(start, n int) []config.Token {
	out := make([]config.Token, n)
	for i := range out {
		out[i] = config.Token(start + i)
	}
	return out
}

func cat(parts ...[]config.Token) []config.Token {
	var out []config.Token
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// serve runs a whole request through a tracker: create (reusing), resume,
// compute and commit the prompt, close. Its blocks stay cached.
func (r *rig) serve(tr *Tracker, id string, prompt []config.Token) {
	r.t.Helper()
	c := r.open(tr, id, prompt)
	require.NoError(r.t, c.Close())
}

func (r *rig) open(tr *Tracker, id string, prompt []config.Token) *TrackedCache {
	r.t.Helper()
	c, err := tr.Create(id, core.CacheOptions{InputTokens: prompt})
	require.NoError(r.t, err)
	require.NoError(r.t, c.Resume(r.stream))
	require.NoError(r.t, c.Resize(len(prompt), len(prompt)))
	require.NoError(r.t, c.Commit(prompt[c.NumCommittedTokens():], false))
	return c
}

// recorder is a CPAwareKVManager that records notifications.
type recorder struct {
	Null
	mu        sync.Mutex
	allocated map[string][]blockhash.Key
	freed     map[string][][]blockhash.Key
}

func newRecorder() *recorder {
	return &recorder{allocated: map[string][]blockhash.Key{}, freed: map[string][][]blockhash.Key{}}
}

func (r *recorder) NotifyBlocksAllocated(id string, keys []blockhash.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.allocated[id] = append(r.allocated[id], keys...)
}

func (r *recorder) NotifyBlocksFreed(id string, keys []blockhash.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.freed[id] = append(r.freed[id], keys)
}
