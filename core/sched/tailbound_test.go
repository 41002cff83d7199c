package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/cp"
)

// tailJudge re-derives the Aged tail bound from the outside: it keeps the
// waiting requests in arrival order with their arrival times and the waits
// of the last AgeHistory admissions, and counts every admission that
// bypassed a request that had waited at least the round's threshold.
type tailJudge struct {
	factor     float64
	waiting    []string
	arrived    map[string]time.Duration
	waits      []time.Duration
	violations int
	// bypassedYoung counts bypasses of requests still below the threshold:
	// the reordering the policy is allowed.
	bypassedYoung int
}

func newTailJudge(factor float64) *tailJudge {
	return &tailJudge{factor: factor, arrived: map[string]time.Duration{}}
}

func (j *tailJudge) enqueue(s *Scheduler, id string, now time.Duration) {
	j.waiting = append(j.waiting, id)
	j.arrived[id] = now
	s.Enqueue(id, nil)
}

func (j *tailJudge) threshold() time.Duration {
	if len(j.waits) == 0 {
		return 0
	}
	var sum time.Duration
	for _, w := range j.waits {
		sum += w
	}
	return time.Duration(j.factor * float64(sum) / float64(len(j.waits)))
}

// round checks one Admit call made at now.
func (j *tailJudge) round(adm []Admission, now time.Duration) {
	th := j.threshold()
	for _, a := range adm {
		i := slices.Index(j.waiting, a.ID)
		for _, older := range j.waiting[:i] {
			if now-j.arrived[older] >= th {
				j.violations++
			} else {
				j.bypassedYoung++
			}
		}
		j.waiting = slices.Delete(j.waiting, i, i+1)
		j.waits = append(j.waits, now-j.arrived[a.ID])
		if len(j.waits) > AgeHistory {
			j.waits = j.waits[1:]
		}
	}
}

// The Aged policy's tail bound holds against an adversary: after a backlog
// that builds a history of long waits has drained, a no-reuse victim is
// followed by one
// high-reuse arrival per round, forever, and each round admits one request.
// The newcomers bypass the victim only while it is younger than the age
// factor times the recent mean wait, never after, and never more than the
// window allows; a plain window keeps bypassing it past that age.
func TestAgedNeverBypassesARequestThatWaitedTheAgeThreshold(t *testing.T) {
	for _, f := range []float64{0.5, 1, 2} {
		for _, p := range []Policy{Aged(64, f), Window(64)} {
			var now time.Duration
			s, err := New(p, newScoreIndex(), WithClock(func() time.Duration { return now }))
			require.NoError(t, err)
			j := newTailJudge(f)
			for i := 0; i < 30; i++ {
				j.enqueue(s, fmt.Sprint("old", i), now)
			}
			victimAt := -1
			for r := 0; r < 300; r++ {
				if r == 30 {
					j.enqueue(s, "victim", now)
				}
				if r >= 30 {
					j.enqueue(s, fmt.Sprint("hi", r), now)
				}
				adm := s.Admit(admitN(1))
				j.round(adm, now)
				for _, a := range adm {
					if a.ID == "victim" {
						victimAt = r
						assert.LessOrEqual(t, a.Bypassed, 63, "%v: the window bound holds too", p)
					}
				}
				now += time.Second
			}
			require.GreaterOrEqual(t, victimAt, 0, "%v: the victim is admitted", p)
			if p.Kind == KindAged {
				assert.Zero(t, j.violations, "%v: nobody is bypassed past the age threshold", p)
				assert.Zero(t, s.Stats().BoundViolations, "%v: the scheduler's own check agrees", p)
				assert.Positive(t, j.bypassedYoung, "%v: it does reorder young waiters", p)
			} else {
				assert.Positive(t, j.violations, "%v: a plain window bypasses requests past the threshold", p)
			}
		}
	}
}

// The tail bound holds under random arrivals, scores, capacities and clock
// steps, for every age factor and window.
func TestAgedTailBoundHoldsUnderRandomArrivalsScoresAndCapacity(t *testing.T) {
	for _, p := range []Policy{Aged(1, 0), Aged(4, 0.5), Aged(16, 0), Aged(64, 3)} {
		for seed := uint64(0); seed < 5; seed++ {
			rng := rand.New(rand.NewPCG(seed, 7))
			scores := map[string]float64{}
			x := cp.NewDelegating(cp.External{
				PredictPrefixReuse: func(id string, _ []config.Token) (float64, error) { return scores[id], nil },
			}, cp.DelegatingOptions{OrderByScores: true})
			var now time.Duration
			s, err := New(p, x, WithClock(func() time.Duration { return now }))
			require.NoError(t, err)
			j := newTailJudge(p.ageFactor())
			n := 0
			for r := 0; r < 600; r++ {
				for k := rng.IntN(4); k > 0; k-- {
					id := fmt.Sprint("r", n)
					n++
					scores[id] = rng.Float64()
					j.enqueue(s, id, now)
				}
				now += time.Duration(rng.IntN(3)) * time.Millisecond
				adm := s.Admit(admitN(rng.IntN(4)))
				j.round(adm, now)
				for _, a := range adm {
					require.LessOrEqual(t, a.Bypassed, p.Window-1, "%v seed %d", p, seed)
				}
			}
			assert.Zero(t, j.violations, "%v seed %d", p, seed)
			assert.Zero(t, s.Stats().BoundViolations, "%v seed %d", p, seed)
			if p.Window > 1 {
				assert.Positive(t, j.bypassedYoung, "%v seed %d: young waiters are reordered", p, seed)
			}
		}
	}
}

// Before any admission the threshold is 0: every waiter counts as old and
// Aged admits in arrival order, asking the index nothing.
func TestAgedStartsAsFCFS(t *testing.T) {
	x := newScoreIndex()
	s, err := New(Aged(8, 0), x, WithClock(func() time.Duration { return 0 }))
	require.NoError(t, err)
	_, err = New(Aged(8, 0), x, WithClock(nil))
	assert.ErrorContains(t, err, "WithClock needs a clock")
	s.Enqueue("lo", nil)
	s.Enqueue("hi", nil)
	assert.Equal(t, "lo", s.Admit(admitN(1))[0].ID)
	assert.Zero(t, x.prio)
}

// The default policy is tail-safe: it has both a starvation bound and the
// age bound, and it holds them against the adversary above.
func TestTheDefaultPolicysTailBoundHolds(t *testing.T) {
	p := Default()
	require.Equal(t, KindAged, p.Kind)
	_, ok := p.Bound(0)
	require.True(t, ok)
	var now time.Duration
	s, err := New(p, newScoreIndex(), WithClock(func() time.Duration { return now }))
	require.NoError(t, err)
	j := newTailJudge(p.ageFactor())
	for i := 0; i < 40; i++ {
		j.enqueue(s, fmt.Sprint("old", i), now)
	}
	for r := 0; r < 500; r++ {
		if r >= 40 {
			j.enqueue(s, fmt.Sprint("hi", r), now)
		}
		if r == 40 {
			j.enqueue(s, "victim", now)
		}
		j.round(s.Admit(admitN(1)), now)
		now += time.Second
	}
	assert.NotContains(t, j.waiting, "victim")
	assert.Zero(t, j.violations)
	assert.Zero(t, s.Stats().BoundViolations)
}
