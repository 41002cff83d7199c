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
package sched

import (
	"fmt"
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
)

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
	// Window (window): the reordering window, in arrivals.
	Window int
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
	case KindWindow:
		return p.Window - 1, true
	}
	return 0, false
}

// Bounded reports whether the policy has a starvation bound.
func (p Policy) Bounded() bool {
	_, ok := p.Bound(0)
	return ok
}

func (p Policy) scanCap() int {
	if p.ScanCap == 0 {
		return DefaultScanCap
	}
	return p.ScanCap
}

// String returns the policy in the form ParsePolicy reads: fcfs, lpm:128,
// klpm:4, klpm:4:128, window:32, resort.
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
	}
	return fmt.Sprintf("Policy(%d)", int(p.Kind))
}

// BoundString describes the bound: "0", "N-1=31", "(k-1)(older+1)" or
// "none".
func (p Policy) BoundString() string {
	switch p.Kind {
	case KindFCFS:
		return "0"
	case KindKLPM:
		return fmt.Sprintf("%d·(older+1)", p.K-1)
	case KindWindow:
		return strconv.Itoa(p.Window - 1)
	}
	return "none"
}

// ParsePolicy reads fcfs, lpm[:scanCap], klpm:k[:scanCap], window:n or
// resort.
func ParsePolicy(s string) (Policy, error) {
	parts := strings.Split(strings.TrimSpace(strings.ToLower(s)), ":")
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
		return Policy{}, fmt.Errorf("sched: unknown policy %q (fcfs, lpm[:cap], klpm:k[:cap], window:n, resort)", s)
	}
	if len(nums) > maxArgs {
		return Policy{}, fmt.Errorf("sched: policy %q: too many parameters", s)
	}
	return p, p.Validate()
}
