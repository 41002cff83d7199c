package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/cp"
)

// scoreIndex scores a request by its id's prefix: "hi…" 1, "mid…" 0.5,
// anything else 0. It counts calls and has a settable generation.
type scoreIndex struct {
	cp.Null
	gen     uint64
	predict map[string]int
	prio    int
}

func newScoreIndex() *scoreIndex { return &scoreIndex{predict: map[string]int{}} }

func score(id string) float64 {
	switch {
	case strings.HasPrefix(id, "hi"):
		return 1
	case strings.HasPrefix(id, "mid"):
		return 0.5
	}
	return 0
}

func (x *scoreIndex) PredictPrefixReuse(id string, _ []config.Token) float64 {
	x.predict[id]++
	return score(id)
}

func (x *scoreIndex) GetAllocationPriority(ids []string) []string {
	x.prio++
	out := slices.Clone(ids)
	slices.SortStableFunc(out, func(a, b string) int {
		sa, sb := score(a), score(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return 0
	})
	return out
}

func (x *scoreIndex) Generation() uint64 { return x.gen }

// admitN admits at most n requests per round.
func admitN(n int) func(string) bool {
	left := n
	return func(string) bool {
		if left == 0 {
			return false
		}
		left--
		return true
	}
}

func allPolicies() []Policy {
	return []Policy{FCFS(), LPM(0), LPM(4), KLPM(3, 0), KLPM(2, 5), Window(4), Window(1), Aged(8, 0), Aged(3, 0.5), FullResort()}
}

func TestPolicyStringsRoundTrip(t *testing.T) {
	for _, p := range allPolicies() {
		q, err := ParsePolicy(p.String())
		require.NoError(t, err, p.String())
		assert.Equal(t, p.String(), q.String())
	}
	for _, bad := range []string{"", "lifo", "klpm", "klpm:0", "window:0", "lpm:x", "window:3:4", "lpm:-1",
		"aged", "aged:0", "aged:8:0", "aged:8:-1", "aged:8:nan", "aged:8:1:2", "aged:x"} {
		_, err := ParsePolicy(bad)
		assert.Error(t, err, "%q", bad)
	}
	_, err := New(Policy{Kind: KindWindow}, nil)
	assert.Error(t, err, "a window of 0 is invalid")
	p, err := ParsePolicy("aged:64:0.5")
	require.NoError(t, err)
	assert.Equal(t, Aged(64, 0.5), p)
	assert.Equal(t, "aged:64", Default().String())
}

func TestPolicyBoundsAreDeclared(t *testing.T) {
	b, ok := FCFS().Bound(10)
	assert.True(t, ok)
	assert.Zero(t, b)
	b, ok = Window(8).Bound(1000)
	assert.True(t, ok)
	assert.Equal(t, 7, b, "window bound does not depend on the queue")
	b, ok = KLPM(4, 0).Bound(5)
	assert.True(t, ok)
	assert.Equal(t, 18, b)
	assert.False(t, LPM(0).Bounded(), "a scan cap bounds work, not starvation")
	assert.False(t, FullResort().Bounded())
}

// With an index that ranks everything equal, every policy admits in arrival
// order: enabling Null reorders nothing.
func TestEveryPolicyUnderNullAdmitsInArrivalOrder(t *testing.T) {
	for _, p := range allPolicies() {
		s, err := New(p, cp.Null{})
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(1, 2))
		var got, want []string
		for i := 0; i < 300; i++ {
			for j := rng.IntN(3); j > 0; j-- {
				id := fmt.Sprint("r", len(want))
				want = append(want, id)
				s.Enqueue(id, nil)
			}
			for _, a := range s.Admit(admitN(rng.IntN(3))) {
				got = append(got, a.ID)
			}
		}
		for s.Len() > 0 {
			for _, a := range s.Admit(admitN(1)) {
				got = append(got, a.ID)
			}
		}
		assert.Equal(t, want, got, p.String())
		assert.Zero(t, s.Stats().MaxBypass, p.String())
	}
}

func TestFCFSNeverAsksTheIndex(t *testing.T) {
	x := newScoreIndex()
	s, err := New(FCFS(), x)
	require.NoError(t, err)
	s.Enqueue("lo", nil)
	s.Enqueue("hi", nil)
	assert.Equal(t, "lo", s.Admit(admitN(1))[0].ID)
	assert.Empty(t, x.predict)
	assert.Zero(t, x.prio)
}

func TestScoresAreComputedOncePerRequestPerGeneration(t *testing.T) {
	for _, p := range []Policy{LPM(0), KLPM(2, 0), Window(100), FullResort()} {
		x := newScoreIndex()
		s, err := New(p, x)
		require.NoError(t, err)
		for i := 0; i < 20; i++ {
			s.Enqueue(fmt.Sprint("r", i), nil)
		}
		for round := 0; round < 50; round++ {
			s.Admit(admitN(0)) // nothing fits: the queue stays
		}
		for i := 0; i < 20; i++ {
			assert.Equal(t, 1, x.predict[fmt.Sprint("r", i)], "%v: scored once while the generation stays", p)
		}
		assert.Equal(t, 50, x.prio, "the priority order is asked every round")
		x.gen++
		for round := 0; round < 10; round++ {
			s.Admit(admitN(0))
		}
		for i := 0; i < 20; i++ {
			assert.Equal(t, 2, x.predict[fmt.Sprint("r", i)], "%v: once more after the cache changed", p)
		}
		assert.Equal(t, uint64(40), s.Stats().ScoreCalls)
	}
}

func TestScoresOfANonGenerationalIndexAreComputedOnce(t *testing.T) {
	calls := 0
	d := cp.NewDelegating(cp.External{
		PredictPrefixReuse: func(string, []config.Token) (float64, error) { calls++; return 0.5, nil },
	}, cp.DelegatingOptions{})
	s, err := New(LPM(0), d)
	require.NoError(t, err)
	s.Enqueue("a", nil)
	for i := 0; i < 10; i++ {
		s.Admit(admitN(0))
	}
	assert.Equal(t, 1, calls)
}

func TestKLPMMakesEveryKthAdmissionTheOldestWaiter(t *testing.T) {
	x := newScoreIndex()
	s, err := New(KLPM(3, 0), x)
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		s.Enqueue(fmt.Sprint("lo", i), nil)
	}
	for i := 0; i < 6; i++ {
		s.Enqueue(fmt.Sprint("hi", i), nil)
	}
	var got []string
	for _, a := range s.Admit(admitN(9)) {
		got = append(got, a.ID)
	}
	assert.Equal(t, []string{"hi0", "hi1", "lo0", "hi2", "hi3", "lo1", "hi4", "hi5", "lo2"}, got)
}

func TestWindowReordersOnlyWithinTheWindow(t *testing.T) {
	x := newScoreIndex()
	s, err := New(Window(3), x)
	require.NoError(t, err)
	for _, id := range []string{"lo0", "lo1", "hi0", "hi1", "hi2"} {
		s.Enqueue(id, nil)
	}
	var got []string
	for _, a := range s.Admit(admitN(2)) {
		got = append(got, a.ID)
	}
	assert.Equal(t, []string{"hi0", "lo0"}, got, "hi1 arrived 3 after lo0: outside the window")
}

// adversary: a victim with no reuse arrives behind `older` low-reuse
// waiters, then one high-reuse request arrives every round, forever, and
// each round admits one request.
func adversary(t *testing.T, p Policy, older, rounds int) (victimBypass int, admittedAt int, st Stats) {
	t.Helper()
	s, err := New(p, newScoreIndex())
	require.NoError(t, err)
	for i := 0; i < older; i++ {
		s.Enqueue(fmt.Sprint("old", i), nil)
	}
	s.Enqueue("victim", nil)
	admittedAt = -1
	for r := 0; r < rounds; r++ {
		s.Enqueue(fmt.Sprint("hi", r), nil)
		for _, a := range s.Admit(admitN(1)) {
			if a.ID == "victim" {
				victimBypass, admittedAt = a.Bypassed, r
			}
		}
	}
	st = s.Stats()
	if admittedAt < 0 {
		victimBypass = st.MaxBypass
	}
	return victimBypass, admittedAt, st
}

func TestBoundedPoliciesHoldTheirBoundUnderAnEndlessHighReuseStream(t *testing.T) {
	const rounds = 2000
	for _, older := range []int{0, 3, 10} {
		for _, p := range []Policy{FCFS(), KLPM(2, 0), KLPM(4, 0), KLPM(4, 8), Window(1), Window(5), Window(64)} {
			bound, ok := p.Bound(older)
			require.True(t, ok)
			bypass, at, st := adversary(t, p, older, rounds)
			assert.GreaterOrEqual(t, at, 0, "%v older=%d: the victim is admitted", p, older)
			assert.LessOrEqual(t, bypass, bound, "%v older=%d", p, older)
			assert.Zero(t, st.BoundViolations, "%v older=%d", p, older)
			if p.Kind != KindFCFS && p.Window != 1 {
				assert.Positive(t, bypass, "%v older=%d: the adversary does get ahead, up to the bound", p, older)
			}
		}
	}
}

func TestUnboundedPoliciesStarveUnderAnEndlessHighReuseStream(t *testing.T) {
	const rounds = 2000
	for _, p := range []Policy{FullResort(), LPM(0), LPM(4)} {
		bypass, at, _ := adversary(t, p, 3, rounds)
		assert.Equal(t, -1, at, "%v: the victim is never admitted", p)
		assert.GreaterOrEqual(t, bypass, rounds-4, "%v: bypassed by every newcomer", p)
		for _, q := range []Policy{KLPM(4, 0), Window(64)} {
			b, _ := q.Bound(3)
			assert.Greater(t, bypass, b, "%v breaks the bound %v keeps", p, q)
		}
	}
}

func TestBoundsHoldUnderRandomArrivalsScoresAndCapacity(t *testing.T) {
	for _, p := range []Policy{FCFS(), KLPM(2, 3), KLPM(5, 0), Window(2), Window(7)} {
		for seed := uint64(0); seed < 5; seed++ {
			rng := rand.New(rand.NewPCG(seed, 99))
			scores := map[string]float64{}
			x := cp.NewDelegating(cp.External{
				PredictPrefixReuse: func(id string, _ []config.Token) (float64, error) { return scores[id], nil },
			}, cp.DelegatingOptions{OrderByScores: true})
			s, err := New(p, x)
			require.NoError(t, err)
			n := 0
			for r := 0; r < 500; r++ {
				for j := rng.IntN(4); j > 0; j-- {
					id := fmt.Sprint("r", n)
					n++
					scores[id] = rng.Float64()
					s.Enqueue(id, nil)
				}
				for _, a := range s.Admit(admitN(rng.IntN(4))) {
					b, _ := p.Bound(a.Older)
					require.LessOrEqual(t, a.Bypassed, b, "%v seed %d", p, seed)
				}
			}
			assert.Zero(t, s.Stats().BoundViolations, "%v seed %d", p, seed)
		}
	}
}

// garbageIndex answers with invented, duplicated and missing ids.
type garbageIndex struct{ cp.Null }

func (garbageIndex) PredictPrefixReuse(string, []config.Token) float64 { return -7 }
func (garbageIndex) GetAllocationPriority(ids []string) []string {
	if len(ids) == 0 {
		return []string{"ghost"}
	}
	return []string{ids[len(ids)-1], ids[len(ids)-1], "ghost"}
}
func (garbageIndex) GetCPCachedBlocks(string) []blockhash.Key { return []blockhash.Key{1} }

func TestABrokenIndexCannotLoseOrDuplicateRequests(t *testing.T) {
	for _, p := range allPolicies() {
		s, err := New(p, garbageIndex{})
		require.NoError(t, err)
		want := map[string]bool{}
		for i := 0; i < 50; i++ {
			id := fmt.Sprint("r", i)
			want[id] = true
			s.Enqueue(id, nil)
		}
		got := map[string]int{}
		for round := 0; s.Len() > 0 && round < 1000; round++ {
			for _, a := range s.Admit(admitN(3)) {
				got[a.ID]++
				assert.Zero(t, a.Score, "scores are clamped")
			}
		}
		assert.Len(t, got, len(want), p.String())
		for id, n := range got {
			assert.True(t, want[id], "%v admitted an invented id %q", p, id)
			assert.Equal(t, 1, n, "%v admitted %q twice", p, id)
		}
	}
}

func TestRemoveDropsAWaiter(t *testing.T) {
	s, err := New(LPM(0), cp.Null{})
	require.NoError(t, err)
	s.Enqueue("a", nil)
	s.Enqueue("b", nil)
	assert.True(t, s.Remove("a"))
	assert.False(t, s.Remove("a"))
	assert.Equal(t, []string{"b"}, s.Waiting())
}
