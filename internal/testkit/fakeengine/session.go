package fakeengine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device"
)

// Request is one request to serve: a prompt and how many tokens to generate
// after it.
type Request struct {
	Scope     blockhash.Scope
	Prompt    []config.Token
	OutputLen int
	// Priority, if set, is the cache's eviction priority function.
	Priority core.PriorityFunc
}

// Session is one request in flight, driven step by step the way an engine's
// scheduler drives it: Start creates its cache (reusing the longest cached
// prefix), Resume activates it and verifies every position it holds, each
// Advance computes one prefill chunk or one generated token and commits it,
// Suspend and Resume may interleave freely, and Close releases it.
//
// A Session is not safe for concurrent use; different sessions are.
type Session struct {
	e        *Engine
	req      Request
	c        *core.KVCache
	tokens   []config.Token // prompt, then the tokens generated so far
	hashes   []uint64       // prefix hash of tokens[:p+1] for every p computed so far
	computed int            // positions whose KV is written and committed
	reused   int
}

// Start creates the request's cache, SUSPENDED, holding the longest reusable
// cached prefix of the prompt, and commits the statistics of its creation
// (its reuse, its SSM snapshot lookup), as an engine does once it schedules
// the request.
func (e *Engine) Start(req Request) (*Session, error) {
	if len(req.Prompt) == 0 {
		return nil, fmt.Errorf("fakeengine: empty prompt: %w", core.ErrInvalidArgument)
	}
	if req.OutputLen < 0 {
		return nil, fmt.Errorf("fakeengine: negative output length %d: %w", req.OutputLen, core.ErrInvalidArgument)
	}
	c, err := e.m.CreateKVCache(core.CacheOptions{Scope: req.Scope, InputTokens: req.Prompt, Priority: req.Priority})
	if err != nil {
		return nil, err
	}
	c.CommitPendingStats()
	s := &Session{e: e, req: req, c: c, reused: c.ReusedTokens()}
	s.tokens = make([]config.Token, len(req.Prompt), len(req.Prompt)+req.OutputLen)
	copy(s.tokens, req.Prompt)
	s.computed = s.reused
	return s, nil
}

// Cache returns the session's cache.
func (s *Session) Cache() *core.KVCache { return s.c }

// Tokens returns the prompt followed by the tokens generated so far. The
// slice must not be modified.
func (s *Session) Tokens() []config.Token { return s.tokens }

// Reused is the number of prompt tokens reused at Start.
func (s *Session) Reused() int { return s.reused }

// Computed is the number of positions whose KV the cache holds (reused or
// written) and that are committed.
func (s *Session) Computed() int { return s.computed }

// Done reports whether the prompt and every output token are computed.
func (s *Session) Done() bool { return s.computed == len(s.req.Prompt)+s.req.OutputLen }

func (s *Session) hashesTo(n int) []uint64 {
	if len(s.hashes) < n {
		s.hashes = appendPrefixHashes(s.hashes, s.e.opts.Seed, s.tokens[:n])
	}
	return s.hashes
}

// Resume makes the cache ACTIVE on stream and verifies every position it
// holds a page for; the first Resume so checks the reused prefix.
func (s *Session) Resume(stream device.Stream) (VerifyResult, error) {
	if err := s.c.Resume(stream); err != nil {
		return VerifyResult{}, err
	}
	return s.e.verify(s.c, core.DefaultBeamIndex, s.tokens, s.hashesTo(s.computed), 0, s.computed)
}

// Verify checks every position the cache holds a page for; the cache must be
// ACTIVE.
func (s *Session) Verify() (VerifyResult, error) {
	return s.e.verify(s.c, core.DefaultBeamIndex, s.tokens, s.hashesTo(s.computed), 0, s.computed)
}

// Suspend makes the cache SUSPENDED.
func (s *Session) Suspend() error { return s.c.Suspend() }

// Advance runs one engine step on the ACTIVE cache: the next prefill chunk
// (Options.ChunkTokens prompt tokens) or, once the prompt is computed, one
// generated token. The step resizes the cache (capacity for the new
// positions, history at the computed ones), writes the new positions' KV,
// advances the history and commits the new tokens; the last step commits
// with isEnd. On error the session stays consistent and the step may be
// retried (for example after ErrOutOfPages, once pages are freed). It reports
// whether the request is complete.
func (s *Session) Advance() (done bool, err error) {
	if s.Done() {
		return true, nil
	}
	prompt := len(s.req.Prompt)
	var to int
	if s.computed < prompt {
		to = min(s.computed+s.e.opts.ChunkTokens, prompt)
	} else {
		if len(s.tokens) == s.computed {
			h := s.hashesTo(len(s.tokens))
			s.tokens = append(s.tokens, nextToken(h[len(s.tokens)-1], s.e.opts.Vocab))
		}
		to = s.computed + 1
	}
	if err := s.c.Resize(to, s.computed); err != nil {
		return false, err
	}
	var hashes []uint64
	if !s.e.opts.NoData {
		hashes = s.hashesTo(to)
	}
	if err := s.e.step(s.c, core.DefaultBeamIndex, s.tokens, hashes, s.computed, to); err != nil {
		return false, err
	}
	if err := s.c.Resize(to, to); err != nil {
		return false, err
	}
	last := to == prompt+s.req.OutputLen
	if err := s.c.Commit(s.tokens[s.computed:to], last); err != nil {
		return false, err
	}
	s.computed = to
	return last, nil
}

// Close closes the cache. Closing twice does nothing.
func (s *Session) Close() error { return s.c.Close() }

// Result is the outcome of Serve.
type Result struct {
	// Tokens is the prompt followed by the generated tokens.
	Tokens []config.Token
	// Reused is the number of prompt tokens reused from the cache.
	Reused int
	// Verified is the check of the reused prefix at Resume.
	Verified VerifyResult
	// Final is the check of every position before Close.
	Final VerifyResult
}

// Serve runs a whole request on stream: Start (reuse), Resume (which
// verifies the reused prefix), Advance until done, Verify (every position
// the cache still holds), Close. The cache is closed on every path.
func (e *Engine) Serve(stream device.Stream, req Request) (Result, error) {
	s, err := e.Start(req)
	if err != nil {
		return Result{}, err
	}
	res := Result{Reused: s.reused}
	res.Verified, err = s.Resume(stream)
	for done := false; err == nil && !done; {
		done, err = s.Advance()
	}
	if err == nil {
		res.Final, err = s.Verify()
	}
	if cerr := s.Close(); err == nil {
		err = cerr
	} else if cerr != nil {
		err = errors.Join(err, cerr)
	}
	res.Tokens = slices.Clip(s.tokens)
	return res, err
}
