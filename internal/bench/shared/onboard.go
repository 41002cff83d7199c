package shared

import (
	"context"
	"fmt"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/sharedtier"
	"github.com/redis/rueidis"
)

// Onboarding through the manager: a writer manager commits a prompt of n
// blocks of one value size each (one layer, key and value half the size
// each: the default codec's cold blob is the value size plus a header) and
// writes them through to the cluster; a second manager, a fresh "node" on
// the same device backend, then creates a cache for the prompt and resumes
// it, twice: the first warms its memory, the reusable blocks are cleared and
// the second is timed. The onboarding time is that of CreateKVCache (lookup, fetch, landing
// in the host tier) plus Resume until its stream is synchronized (decode to
// the GPU); its GB/s are payload bytes over it. Its reference is a raw
// pipelined GET (batches of Config.Batch, one caller) of the same blobs,
// timed right before the onboarding in even rounds and right after it in odd
// ones, so that both sides of the ratio see the same load of the machine.

const onboardTokensPerBlock = 16

func onboardConfig(addrs []string, ns string, n, size int) config.Config {
	half := int64(size / 2)
	room := int64(n+8) * int64(size)
	return config.Config{
		TokensPerBlock: onboardTokensPerBlock,
		Layers: []config.AttentionLayerConfig{{LayerID: 0, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: half}, {Role: config.RoleValue, Size: int64(size) - half}}}},
		CacheTiers: []config.CacheTierConfig{config.GPU(room), config.Host(room),
			config.Shared(config.SharedCacheTierConfig{Addresses: addrs, Namespace: ns,
				WritePolicy: config.WriteThroughOnCommit, CallTimeout: 30 * time.Second,
				QueueBytes: room + int64(n)*4096})},
	}
}

func onboardPrompt(n int) []config.Token {
	p := make([]config.Token, n*onboardTokensPerBlock)
	for i := range p {
		p[i] = config.Token(i*7919%50000 + 1)
	}
	return p
}

// onboardRound writes n blocks of size bytes through one manager and times
// their onboarding into another, and the raw GET of their blobs beside it
// (bytes: the blob bytes that GET read).
func onboardRound(ctx context.Context, raw rueidis.Client, cfg Config, ns string, round, n, size int) (onboard, get time.Duration, bytes int, err error) {
	mcfg := onboardConfig(cfg.Addresses, ns, n, size)
	prompt := onboardPrompt(n)
	if err := writeThrough(ctx, mcfg, prompt, n); err != nil {
		return 0, 0, 0, err
	}
	names, err := scanNamespace(ctx, raw, ns)
	if err != nil {
		return 0, 0, 0, err
	}
	rawGet := func() error {
		get, bytes, err = rawGetBlobs(ctx, raw, names, cfg.Batch)
		return err
	}
	if round%2 == 0 {
		if err := rawGet(); err != nil {
			return 0, 0, 0, err
		}
	}
	if onboard, err = onboardTimed(mcfg, prompt, n); err != nil {
		return 0, 0, 0, err
	}
	if round%2 == 1 {
		if err := rawGet(); err != nil {
			return 0, 0, 0, err
		}
	}
	return onboard, get, bytes, nil
}

// onboardTimed creates the reading manager and times its second onboarding
// of prompt's n blocks.
func onboardTimed(mcfg config.Config, prompt []config.Token, n int) (time.Duration, error) {
	dev, err := backend.Open("")
	if err != nil {
		return 0, err
	}
	defer dev.Close()
	m, err := core.NewManager(mcfg, core.WithDevice(dev))
	if err != nil {
		return 0, fmt.Errorf("bench shared: onboard: %w", err)
	}
	defer m.Close()
	st, err := dev.NewStream()
	if err != nil {
		return 0, err
	}
	defer st.Close()
	if m.ProbeReuse(blockhash.Scope{}, prompt[:onboardTokensPerBlock]) == 0 {
		return 0, fmt.Errorf("bench shared: onboard: the cluster does not hold the first block")
	}
	// The first onboarding warms the manager's memory (its first touch is
	// the operating system's page faults, not the tier's work); the
	// reusable blocks are then cleared and the second is timed.
	if _, err := onboardOnce(m, st, prompt, n, 1); err != nil {
		return 0, err
	}
	if err := m.ClearReusableBlocks(); err != nil {
		return 0, err
	}
	return onboardOnce(m, st, prompt, n, 2)
}

// onboardOnce times the onboarding of prompt's n blocks, the k-th time.
func onboardOnce(m *core.Manager, st device.Stream, prompt []config.Token, n, k int) (time.Duration, error) {
	start := time.Now()
	c, err := m.CreateKVCache(core.CacheOptions{InputTokens: prompt})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := c.Resume(st); err != nil {
		return 0, fmt.Errorf("bench shared: onboard: resume: %w", err)
	}
	if err := st.Synchronize(); err != nil {
		return 0, err
	}
	d := time.Since(start)
	s, _ := m.SharedStats()
	if c.ReusedTokens() != len(prompt) || s.OnboardedBlocks != int64(k*n) || s.Store.Corrupt != 0 {
		return 0, fmt.Errorf("bench shared: onboard: reused %d of %d tokens, onboarded %d of %d blocks (%d corrupt, %d errors)",
			c.ReusedTokens(), len(prompt), s.OnboardedBlocks, k*n, s.Store.Corrupt, s.Store.Errors)
	}
	return d, nil
}

// writeThrough commits prompt in a manager of mcfg and waits until its n
// blocks are written.
func writeThrough(ctx context.Context, mcfg config.Config, prompt []config.Token, n int) error {
	m, err := core.NewManager(mcfg)
	if err != nil {
		return fmt.Errorf("bench shared: onboard: %w", err)
	}
	defer m.Close()
	st, err := m.Device().NewStream()
	if err != nil {
		return err
	}
	defer st.Close()
	c, err := m.CreateKVCache(core.CacheOptions{InputTokens: prompt})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Resume(st); err != nil {
		return fmt.Errorf("bench shared: onboard: write: %w", err)
	}
	// Prefill in chunks the write queue holds (sharedtier.DefaultQueueBlobs
	// blobs), each flushed, so no write is dropped.
	chunk := sharedtier.DefaultQueueBlobs / 2 * onboardTokensPerBlock
	for done := 0; done < len(prompt); done += chunk {
		to := min(done+chunk, len(prompt))
		for _, step := range []func() error{
			func() error { return c.Resize(to, done) },
			func() error { return c.Resize(to, to) },
			func() error { return c.Commit(prompt[done:to], to == len(prompt)) },
			func() error { return m.FlushShared(ctx) },
		} {
			if err := step(); err != nil {
				return fmt.Errorf("bench shared: onboard: write: %w", err)
			}
		}
	}
	if s, _ := m.SharedStats(); s.Store.Written != int64(n) {
		return fmt.Errorf("bench shared: onboard: wrote %d of %d blocks (%d dropped, %d errors)",
			s.Store.Written, n, s.Store.Dropped, s.Store.WriteErrors)
	}
	return nil
}

// delNamespace deletes every key of a manager's namespace, node by node.
func delNamespace(ctx context.Context, c rueidis.Client, ns string) error {
	names, err := scanNamespace(ctx, c, ns)
	if err != nil {
		return err
	}
	return del(ctx, c, names, 64)
}

// scanNamespace lists the keys of a manager's namespace, node by node.
func scanNamespace(ctx context.Context, c rueidis.Client, ns string) ([]string, error) {
	var names []string
	for addr, node := range c.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match("kvcm:"+ns+":*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				return nil, fmt.Errorf("bench shared: scan %s: %w", addr, err)
			}
			names = append(names, e.Elements...)
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return names, nil
}

// rawGetBlobs reads keys with pipelined GET, one batch at a time, and
// returns the time and the bytes read.
func rawGetBlobs(ctx context.Context, c rueidis.Client, keys []string, batch int) (time.Duration, int, error) {
	bytes := 0
	start := time.Now()
	for _, b := range batches(keys, batch) {
		cmds := make(rueidis.Commands, len(b))
		for i, k := range b {
			cmds[i] = c.B().Get().Key(k).Build()
		}
		for _, r := range c.DoMulti(ctx, cmds...) {
			v, err := r.AsBytes()
			if err != nil {
				return 0, 0, fmt.Errorf("bench shared: raw get of the onboarded blobs: %w", err)
			}
			bytes += len(v)
		}
	}
	return time.Since(start), bytes, nil
}
