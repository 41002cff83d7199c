package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device/backend"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// kvcm demo --shared ADDRS: two nodes share a Redis Cluster. Node a serves
// the first request of every group, writing its blocks through to the
// cluster; node b, a manager of its own on a device of its own (in this
// process with --shared-node both, or in another one with --shared-node b),
// serves every other request and finds the system prompts node a computed in
// the shared tier: they are onboarded shared → host → GPU and verified byte
// for byte like every reused page. Both nodes use the same namespace
// (--shared-namespace), model seed and layout, so their blobs are
// interchangeable.

type sharedDemoFlags struct {
	addrs, namespace, node string
}

func (s *sharedDemoFlags) validate() error {
	if s.addrs == "" {
		return nil
	}
	switch s.node {
	case "a", "b", "both":
	default:
		return fmt.Errorf("--shared-node must be a, b or both, got %q", s.node)
	}
	if err := config.ValidateNamespace(s.namespace); err != nil {
		return fmt.Errorf("--shared-namespace: %v", err)
	}
	return nil
}

func runSharedDemo(f *demoFlags, stdout, stderr io.Writer) int {
	err := demoSharedNodes(f, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvcm demo: %v\n", err)
		return exitFail
	}
	return exitOK
}

func demoSharedNodes(f *demoFlags, stdout, stderr io.Writer) error {
	reqs := f.workload()
	seen := make([]bool, f.groups)
	var first, rest []demoRequest
	for _, r := range reqs {
		if seen[r.group] {
			rest = append(rest, r)
		} else {
			first = append(first, r)
		}
		seen[r.group] = true
	}
	fmt.Fprintf(stdout, "kvcm demo --shared: %d requests = %d groups x %d, system prompt %d tokens; cluster %s, namespace %s\n",
		len(reqs), f.groups, f.perGroup, f.systemTokens, f.shared.addrs, f.shared.namespace)
	if f.shared.node != "b" {
		if err := demoSharedNode(f, "a", first, stdout, stderr); err != nil {
			return err
		}
	}
	if f.shared.node != "a" {
		return demoSharedNode(f, "b", rest, stdout, stderr)
	}
	return nil
}

// demoSharedNode serves reqs on a manager of its own with the shared tier
// (write-through, so the other node finds the blocks at once) and reports
// what it reused from where.
func demoSharedNode(f *demoFlags, name string, reqs []demoRequest, stdout, stderr io.Writer) (err error) {
	diskPath := f.diskPath
	if f.diskQuota > 0 && diskPath == "" {
		if diskPath, err = os.MkdirTemp("", "kvcm-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(diskPath)
	}
	cfg := f.config(diskPath)
	cfg.CacheTiers = append(cfg.CacheTiers, config.Shared(config.SharedCacheTierConfig{
		Addresses: strings.Split(f.shared.addrs, ","), Namespace: f.shared.namespace,
		WritePolicy: config.WriteThroughOnCommit,
	}))
	dev, err := backend.OpenWith(f.device, backend.Options{Emu: emu.Options{Seed: f.seed, MaxDelay: f.maxDelay}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.Close()) }()
	m, err := core.NewManager(cfg, core.WithDevice(dev))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	e, err := fakeengine.New(m, cfg, fakeengine.Options{Seed: uint64(f.seed), ChunkTokens: f.chunk})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	stream, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stream.Close()) }()

	var prompt, reused int64
	start := time.Now()
	for i, r := range reqs {
		res, err := e.Serve(stream, r.Request)
		if err != nil {
			return fmt.Errorf("node %s: request %d of %d: %w", name, i+1, len(reqs), err)
		}
		prompt += int64(len(r.Prompt))
		reused += int64(res.Reused)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.FlushShared(ctx); err != nil {
		return fmt.Errorf("node %s: flush the shared tier's writes: %w", name, err)
	}
	elapsed := time.Since(start)
	st, _ := m.SharedStats()
	es := e.Stats()
	fmt.Fprintf(stdout, "node %s: %d requests in %v; reused %d of %d prompt tokens (%.1f%%)\n",
		name, len(reqs), elapsed.Round(time.Millisecond), reused, prompt, pct(reused, prompt))
	fmt.Fprintf(stdout, "node %s: shared tier: %d of %d blocks looked up found, %d blocks (%s) onboarded; %d pages written through, %d written, %d already there, %d errors\n",
		name, st.FoundBlocks, st.LookupBlocks, st.OnboardedBlocks, formatBytes(st.OnboardedBytes),
		st.WriteThroughs, st.Store.Written, st.Store.Present, st.Store.Errors)
	if es.FirstMismatch != nil {
		fmt.Fprintf(stderr, "kvcm demo: node %s: first mismatch: %v\n", name, es.FirstMismatch)
	}
	fmt.Fprintf(stdout, "node %s: integrity: %d pages verified, %d mismatches\n", name, es.PagesVerified, es.Mismatches)
	if es.Mismatches > 0 {
		return errMismatch
	}
	return nil
}
