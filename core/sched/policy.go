// Package sched is kvcm's admission scheduler: a waiting queue in arrival
// order from which an engine admits requests step by step, ordered by a
// CP-aware index's GetAllocationPriority under a policy with a declared
// starvation bound.
//
// Bypass: a waiting request is bypassed each time a request that arrived
// after it is admitted before it. A policy's starvation bound is the largest
// number of bypasses a request can suffer, whatever arrives after it and
// whatever the index says. It may depend on Older, the number of requests
// already waiting when the request arrived (a finite number, fixed at
// arrival).
//
// Some policies also bound a request's wait relative to the others': Aged
// never lets a request be bypassed once it has waited as long as a multiple
// of the mean wait of recent admissions (its tail bound). Time comes from the
// scheduler's clock (WithClock).
package sched

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Kind names a policy.
type Kind int

const (
	// KindFCFS admits in arrival order.
	KindFCFS Kind = iota
	// KindLPM admits the ScanCap oldest waiters in priority order.
	KindLPM
	// KindKLPM is LPM where every K-th admission is the oldest waiter.
	KindKLPM
	// KindWindow admits in priority order among the waiters that arrived
	// within Window arrivals of the oldest one.
	KindWindow
	// KindFullResort admits the whole queue in priority order every step.
	KindFullResort
	// KindAged is Window, but waiters that have waited AgeFactor times the
	// mean wait of recent admissions go first, in arrival order.
	KindAged
)

// AgeHistory is how many recent admissions the Aged policy's mean wait is
// taken over.
const AgeHistory = 64

// DefaultAgeFactor is the Aged policy's age factor when Policy.AgeFactor is
// 0.
const DefaultAgeFactor = 1.0

// DefaultScanCap is the LPM scan cap used when Policy.ScanCap is 0.
const DefaultScanCap = 128

// Policy is an admission policy. Build one with FCFS, LPM, KLPM, Window or
// FullResort.
//
// Every policy admits in its order until the engine refuses a request (it
// does not fit this step); the refused request and everything after it wait
// for the next step. No policy skips a refused request, so size alone never
// reorders, and with a CP index that ranks everything equal (Null) every
// policy admits exactly in arrival order.
type Policy struct {
	Kind Kind
	// ScanCap (LPM, k-LPM): how many of the oldest waiters are scored and
	// ordered each step; 0 means DefaultScanCap. It bounds the CPU time of a
	// step, not starvation.
	ScanCap int
	// K (k-LPM): every K-th admission is the oldest waiter.
	K int
	// Window (window, aged): the reordering window, in arrivals.
	Window int
	// AgeFactor (aged): a waiter that has waited AgeFactor times the mean
	// wait of the last AgeHistory admissions is no longer bypassed; 0 means
	// DefaultAgeFactor.
	AgeFactor float64
}

// FCFS admits strictly in arrival order.
//
// Starvation bound: 0 bypasses.
func FCFS() Policy { return Policy{Kind: KindFCFS} }

// LPM (longest prefix match) orders the scanCap oldest waiters by
// GetAllocationPriority each step and admits them in that order (scanCap 0
// means DefaultScanCap). The cap bounds the work per step.
//
// Starvation bound: none. A waiter inside the scanned range is overtaken by
// every higher-ranked newcomer that enters it, and under an endless stream of
// high-reuse arrivals a low-reuse request waits forever. It is kept as the
// reference LPM; use KLPM or Window for a bound.
func LPM(scanCap int) Policy { return Policy{Kind: KindLPM, ScanCap: scanCap} }

// KLPM is LPM in which every k-th admission (counted over the scheduler's
// life) is the oldest waiter, whatever its rank; if the oldest waiter does
// not fit, the step admits nothing more.
//
// Starvation bound: (k-1)·(Older+1) bypasses for a request that found Older
// requests waiting. Proof: only the k-1 LPM admissions between two
// oldest-waiter admissions can bypass it, and after at most Older+1
// oldest-waiter admissions it is admitted, since later arrivals are younger.
func KLPM(k, scanCap int) Policy { return Policy{Kind: KindKLPM, K: k, ScanCap: scanCap} }

// Window orders by GetAllocationPriority only the waiters that arrived fewer
// than n arrivals after the oldest waiter, and admits them in that order.
//
// Starvation bound: n-1 bypasses. Proof: while a request R waits, the oldest
// waiter arrived no later than R, so every request admitted ahead of R
// arrived fewer than n arrivals after R: at most n-1 of them.
func Window(n int) Policy { return Policy{Kind: KindWindow, Window: n} }

// Aged is Window(n) made tail-safe. Each round, with T the age factor f
// (0: DefaultAgeFactor) times the mean queueing wait of the last AgeHistory
// admitted requests (T = 0 before the first admission), the waiters that
// have waited at least T are offered first, in arrival order; then the
// other waiters within the window (those that arrived fewer than n arrivals
// after the oldest waiter) in GetAllocationPriority order.
//
// Starvation bound: n-1 bypasses, as Window (the candidates are a subset of
// its window). Tail bound: no request is bypassed in a round in which it has
// waited at least that round's T. Proof: the waiters that waited at least T
// are the oldest (a prefix of the queue in arrival order) and are offered
// in arrival order before any other, and a round ends at the first refusal,
// so everything admitted before such a request arrived before it. Only
// waiters younger than the recent mean wait (f = 1) are reordered: the ones
// that would form FCFS's tail are served as FCFS serves them.
func Aged(n int, f float64) Policy { return Policy{Kind: KindAged, Window: n, AgeFactor: f} }

// Default is the policy recommended when a CP index is present (see
// docs/scheduling.md): Aged(64, 1). Its tail bound kept p99 TTFT within
// noise of FCFS on the workloads measured there, RAG-style traffic
// included, where plain reordering made it much worse. Without an index
// every policy is FCFS.
func Default() Policy { return Aged(64, 1) }

// FullResort orders the whole queue by GetAllocationPriority every step: the
// unbounded stress case.
//
// Starvation bound: none (see LPM).
func FullResort() Policy { return Policy{Kind: KindFullResort} }

// Validate checks the parameters.
func (p Policy) Validate() error {
	switch p.Kind {
	case KindFCFS, KindFullResort:
	case KindLPM:
		if p.ScanCap < 0 {
			return fmt.Errorf("sched: lpm scan cap must be positive, got %d", p.ScanCap)
		}
	case KindKLPM:
		if p.K < 1 {
			return fmt.Errorf("sched: k-lpm k must be at least 1, got %d", p.K)
		}
		if p.ScanCap < 0 {
			return fmt.Errorf("sched: k-lpm scan cap must be positive, got %d", p.ScanCap)
		}
	case KindWindow:
		if p.Window < 1 {
			return fmt.Errorf("sched: window must be at least 1, got %d", p.Window)
		}
	case KindAged:
		if p.Window < 1 {
			return fmt.Errorf("sched: aged window must be at least 1, got %d", p.Window)
		}
		if p.AgeFactor < 0 || math.IsNaN(p.AgeFactor) || math.IsInf(p.AgeFactor, 0) {
			return fmt.Errorf("sched: aged age factor must be finite and non-negative, got %v", p.AgeFactor)
		}
	default:
		return fmt.Errorf("sched: unknown policy kind %d", p.Kind)
	}
	return nil
}

// Bound returns the starvation bound of a request that found older requests
// waiting when it arrived, and false for policies without one.
func (p Policy) Bound(older int) (int, bool) {
	switch p.Kind {
	case KindFCFS:
		return 0, true
	case KindKLPM:
		return (p.K - 1) * (older + 1), true
	case KindWindow, KindAged:
		return p.Window - 1, true
	}
	return 0, false
}

// Bounded reports whether the policy has a starvation bound.
func (p Policy) Bounded() bool {
	_, ok := p.Bound(0)
	return ok
}

func (p Policy) ageFactor() float64 {
	if p.AgeFactor == 0 {
		return DefaultAgeFactor
	}
	return p.AgeFactor
}

func (p Policy) scanCap() int {
	if p.ScanCap == 0 {
		return DefaultScanCap
	}
	return p.ScanCap
}

// String returns the policy in the form ParsePolicy reads: fcfs, lpm:128,
// klpm:4, klpm:4:128, window:32, aged:64, aged:64:0.5, resort.
func (p Policy) String() string {
	switch p.Kind {
	case KindFCFS:
		return "fcfs"
	case KindLPM:
		return fmt.Sprintf("lpm:%d", p.scanCap())
	case KindKLPM:
		if p.ScanCap == 0 {
			return fmt.Sprintf("klpm:%d", p.K)
		}
		return fmt.Sprintf("klpm:%d:%d", p.K, p.ScanCap)
	case KindWindow:
		return fmt.Sprintf("window:%d", p.Window)
	case KindFullResort:
		return "resort"
	case KindAged:
		if p.ageFactor() == DefaultAgeFactor {
			return fmt.Sprintf("aged:%d", p.Window)
		}
		return fmt.Sprintf("aged:%d:%s", p.Window, strconv.FormatFloat(p.AgeFactor, 'g', -1, 64))
	}
	return fmt.Sprintf("Policy(%d)", int(p.Kind))
}

// BoundString describes the bound: "0", "31" (N-1), "3·(older+1)",
// "63, 0 past 1×wait" (aged: N-1, and none once a request waited the age
// factor times the recent mean wait) or "none".
func (p Policy) BoundString() string {
	switch p.Kind {
	case KindFCFS:
		return "0"
	case KindKLPM:
		return fmt.Sprintf("%d·(older+1)", p.K-1)
	case KindWindow:
		return strconv.Itoa(p.Window - 1)
	case KindAged:
		return fmt.Sprintf("%d, 0 past %s×wait", p.Window-1, strconv.FormatFloat(p.ageFactor(), 'g', -1, 64))
	}
	return "none"
}

// ParsePolicy reads fcfs, lpm[:scanCap], klpm:k[:scanCap], window:n,
// aged:n[:factor] or resort.
func ParsePolicy(s string) (Policy, error) {
	parts := strings.Split(strings.TrimSpace(strings.ToLower(s)), ":")
	if parts[0] == "aged" {
		return parseAged(s, parts[1:])
	}
	nums := make([]int, 0, 2)
	for _, x := range parts[1:] {
		n, err := strconv.Atoi(x)
		if err != nil {
			return Policy{}, fmt.Errorf("sched: policy %q: %q is not a number", s, x)
		}
		nums = append(nums, n)
	}
	arg := func(i, def int) int {
		if i < len(nums) {
			return nums[i]
		}
		return def
	}
	var p Policy
	maxArgs := 0
	switch parts[0] {
	case "fcfs":
		p = FCFS()
	case "lpm":
		p, maxArgs = LPM(arg(0, 0)), 1
	case "klpm", "k-lpm":
		if len(nums) == 0 {
			return Policy{}, fmt.Errorf("sched: policy %q: klpm needs k, as klpm:4", s)
		}
		p, maxArgs = KLPM(nums[0], arg(1, 0)), 2
	case "window":
		if len(nums) == 0 {
			return Policy{}, fmt.Errorf("sched: policy %q: window needs its size, as window:32", s)
		}
		p, maxArgs = Window(nums[0]), 1
	case "resort", "full-resort", "fullresort":
		p = FullResort()
	default:
		return Policy{}, fmt.Errorf("sched: unknown policy %q (fcfs, lpm[:cap], klpm:k[:cap], window:n, aged:n[:factor], resort)", s)
	}
	if len(nums) > maxArgs {
		return Policy{}, fmt.Errorf("sched: policy %q: too many parameters", s)
	}
	return p, p.Validate()
}

func parseAged(s string, args []string) (Policy, error) {
	if len(args) == 0 || len(args) > 2 {
		return Policy{}, fmt.Errorf("sched: policy %q: aged takes its window and an optional age factor, as aged:64 or aged:64:0.5", s)
	}
	n, err := strconv.Atoi(args[0])
	if err != nil {
		return Policy{}, fmt.Errorf("sched: policy %q: window %q is not a number", s, args[0])
	}
	var f float64
	if len(args) == 2 {
		if f, err = strconv.ParseFloat(args[1], 64); err != nil || !(f > 0) {
			return Policy{}, fmt.Errorf("sched: policy %q: age factor %q must be a positive number", s, args[1])
		}
	}
	p := Aged(n, f)
	return p, p.Validate()
}
