package sched

import (
	"errors"
	"slices"
	"time"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/cp"
)

// Admission is one admitted request.
type Admission struct {
	ID string
	// Bypassed is how many later arrivals were admitted before it.
	Bypassed int
	// Older is how many requests were waiting when it arrived.
	Older int
	// Score is its last PredictPrefixReuse score (0 under FCFS).
	Score float64
}

// Stats describes a scheduler's work so far.
type Stats struct {
	// Rounds counts Admit calls.
	Rounds uint64
	// Admitted counts admissions.
	Admitted uint64
	// ScoreCalls counts PredictPrefixReuse calls; PriorityCalls counts
	// GetAllocationPriority calls.
	ScoreCalls, PriorityCalls uint64
	// MaxBypass is the largest bypass count of any request, admitted or
	// still waiting.
	MaxBypass int
	// BoundViolations counts requests whose bypass count exceeded the
	// policy's bound, and (Aged) bypasses of a request that had waited the
	// round's age threshold. It stays 0 for a bounded policy; unbounded
	// policies have nothing to violate and report 0 too.
	BoundViolations int
	// AgeThreshold is the Aged policy's threshold in the last round.
	AgeThreshold time.Duration
}

type waiter struct {
	id        string
	tokens    []config.Token
	seq       uint64
	older     int
	bypass    int
	score     float64
	scored    bool
	scoredGen uint64
	arrived   time.Duration
	taken     bool // admitted in the current round
}

// Option configures a Scheduler.
type Option func(*Scheduler)

// WithClock makes now the scheduler's clock, read at Enqueue (a request's
// arrival) and at Admit; it must not go backwards. The default is the
// monotonic wall-clock time since New. A simulator passes its virtual time.
func WithClock(now func() time.Duration) Option {
	return func(s *Scheduler) { s.now = now }
}

// Scheduler is an admission queue. It is not safe for concurrent use: an
// engine's scheduling loop owns it.
//
// Each round, the policy's candidates are scored with PredictPrefixReuse
// (once per request per change of the index's Generation, or once per
// request for an index that is not Generational), ordered with
// GetAllocationPriority (the result repaired into a permutation, so a broken
// index cannot lose or duplicate a request), and offered to the engine in
// the policy's order. FCFS consults the index not at all.
type Scheduler struct {
	policy Policy
	cp     cp.CPAwareKVManager
	gen    cp.Generational
	rel    cp.ScoreReleaser
	queue  []*waiter
	seq    uint64
	admits uint64
	stats  Stats
	now    func() time.Duration
	// waits are the queueing times of the last AgeHistory admissions, a
	// ring from waitNext; waitSum is their sum.
	waits    []time.Duration
	waitNext int
	waitSum  time.Duration
	// roundNow is the clock in the current round, threshold the Aged
	// policy's age threshold.
	roundNow, threshold time.Duration
}

// New returns a scheduler; a nil index is cp.Null.
func New(p Policy, index cp.CPAwareKVManager, opts ...Option) (*Scheduler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if index == nil {
		index = cp.Null{}
	}
	start := time.Now()
	s := &Scheduler{policy: p, cp: index, now: func() time.Duration { return time.Since(start) }}
	for _, o := range opts {
		o(s)
	}
	if s.now == nil {
		return nil, errors.New("sched: WithClock needs a clock, got nil")
	}
	s.gen, _ = index.(cp.Generational)
	s.rel, _ = index.(cp.ScoreReleaser)
	return s, nil
}

// Policy returns the scheduler's policy.
func (s *Scheduler) Policy() Policy { return s.policy }

// Enqueue adds a request at the tail. The scheduler keeps tokens (without
// copying) until the request is admitted or removed. Ids must be unique
// among waiting requests.
func (s *Scheduler) Enqueue(id string, tokens []config.Token) {
	s.seq++
	s.queue = append(s.queue, &waiter{id: id, tokens: tokens, seq: s.seq, older: len(s.queue), arrived: s.now()})
}

// Len returns the number of waiting requests.
func (s *Scheduler) Len() int { return len(s.queue) }

// Waiting returns the ids of waiting requests in arrival order.
func (s *Scheduler) Waiting() []string {
	out := make([]string, len(s.queue))
	for i, w := range s.queue {
		out[i] = w.id
	}
	return out
}

// Remove drops a waiting request (for example a cancelled one) and reports
// whether it was waiting.
func (s *Scheduler) Remove(id string) bool {
	for i, w := range s.queue {
		if w.id == id {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			if s.rel != nil {
				s.rel.ReleaseScore(id)
			}
			return true
		}
	}
	return false
}

// Stats returns the scheduler's counters.
func (s *Scheduler) Stats() Stats {
	st := s.stats
	for _, w := range s.queue {
		st.MaxBypass = max(st.MaxBypass, w.bypass)
	}
	return st
}

// Admit runs one admission round. offer is called with candidates in the
// policy's order; it returns true when it admitted the request (which then
// leaves the queue) and false when the request does not fit, which ends the
// round. Admit returns the admitted requests in admission order.
func (s *Scheduler) Admit(offer func(id string) bool) []Admission {
	s.stats.Rounds++
	if len(s.queue) == 0 {
		return nil
	}
	s.roundNow = s.now()
	var out []Admission
	take := func(w *waiter) bool {
		if !offer(w.id) {
			return false
		}
		w.taken = true
		out = append(out, s.admitted(w))
		return true
	}
	switch s.policy.Kind {
	case KindFCFS:
		for _, w := range s.queue {
			if !take(w) {
				break
			}
		}
	case KindLPM, KindFullResort, KindWindow:
		for _, w := range s.order(s.candidates()) {
			if !take(w) {
				break
			}
		}
	case KindAged:
		s.threshold = s.ageThreshold()
		s.stats.AgeThreshold = s.threshold
		cands := s.candidates()
		old := 0
		for old < len(s.queue) && s.roundNow-s.queue[old].arrived >= s.threshold {
			old++
		}
		admitting := true
		for _, w := range s.queue[:old] {
			if admitting = take(w); !admitting {
				break
			}
		}
		if admitting && old < len(cands) {
			for _, w := range s.order(cands[old:]) {
				if !take(w) {
					break
				}
			}
		}
	case KindKLPM:
		order := s.order(s.candidates())
		next := 0
		for {
			var w *waiter
			if s.admits%uint64(s.policy.K) == uint64(s.policy.K-1) {
				w = s.oldestLeft()
			} else {
				for next < len(order) && order[next].taken {
					next++
				}
				if next < len(order) {
					w = order[next]
				}
			}
			if w == nil || !take(w) {
				break
			}
		}
	}
	s.compact()
	return out
}

// admitted does the bookkeeping of one admission: bypasses of older waiters,
// the bound check, counters.
func (s *Scheduler) admitted(w *waiter) Admission {
	s.admits++
	s.stats.Admitted++
	aged := s.policy.Kind == KindAged
	for _, o := range s.queue {
		if o.seq >= w.seq {
			break
		}
		if !o.taken {
			o.bypass++
			if aged && s.roundNow-o.arrived >= s.threshold {
				s.stats.BoundViolations++
			}
		}
	}
	s.recordWait(s.roundNow - w.arrived)
	s.stats.MaxBypass = max(s.stats.MaxBypass, w.bypass)
	if b, ok := s.policy.Bound(w.older); ok && w.bypass > b {
		s.stats.BoundViolations++
	}
	if s.rel != nil {
		s.rel.ReleaseScore(w.id)
	}
	return Admission{ID: w.id, Bypassed: w.bypass, Older: w.older, Score: w.score}
}

// recordWait adds an admission's queueing time to the recent ones.
func (s *Scheduler) recordWait(d time.Duration) {
	if len(s.waits) < AgeHistory {
		s.waits = append(s.waits, d)
		s.waitSum += d
		return
	}
	s.waitSum += d - s.waits[s.waitNext]
	s.waits[s.waitNext] = d
	s.waitNext = (s.waitNext + 1) % AgeHistory
}

// ageThreshold is the age factor times the mean recent wait (0 before any
// admission).
func (s *Scheduler) ageThreshold() time.Duration {
	if len(s.waits) == 0 {
		return 0
	}
	mean := float64(s.waitSum) / float64(len(s.waits))
	return time.Duration(s.policy.ageFactor() * mean)
}

func (s *Scheduler) oldestLeft() *waiter {
	for _, w := range s.queue {
		if !w.taken {
			return w
		}
	}
	return nil
}

// compact removes the waiters admitted this round.
func (s *Scheduler) compact() {
	q := s.queue[:0]
	for _, w := range s.queue {
		if !w.taken {
			q = append(q, w)
		}
	}
	clear(s.queue[len(q):])
	s.queue = q
}

// candidates returns the waiters the policy may reorder, in arrival order.
func (s *Scheduler) candidates() []*waiter {
	switch s.policy.Kind {
	case KindLPM, KindKLPM:
		return s.queue[:min(len(s.queue), s.policy.scanCap())]
	case KindWindow, KindAged:
		limit := s.queue[0].seq + uint64(s.policy.Window)
		n := 0
		for n < len(s.queue) && s.queue[n].seq < limit {
			n++
		}
		return s.queue[:n]
	}
	return s.queue
}

// order scores the candidates where their score may be stale and returns
// them in the index's priority order.
func (s *Scheduler) order(cands []*waiter) []*waiter {
	var gen uint64
	if s.gen != nil {
		gen = s.gen.Generation()
	}
	ids := make([]string, len(cands))
	byID := make(map[string]*waiter, len(cands))
	for i, w := range cands {
		if !w.scored || w.scoredGen != gen {
			w.score = cp.ClampScore(s.cp.PredictPrefixReuse(w.id, w.tokens))
			w.scored, w.scoredGen = true, gen
			s.stats.ScoreCalls++
		}
		ids[i] = w.id
		byID[w.id] = w
	}
	s.stats.PriorityCalls++
	ranked := cp.RepairOrder(ids, s.cp.GetAllocationPriority(slices.Clone(ids)))
	out := make([]*waiter, len(ranked))
	for i, id := range ranked {
		out[i] = byID[id]
	}
	return out
}
