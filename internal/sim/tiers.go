package sim

import (
	"fmt"
	"strings"

	"github.com/kvcm/kvcm/core/sched"
)

// Tiers sizes the cold levels under the GPU, as multiples of the run's GPU
// capacity (CapacityTokens). Zero leaves a level out; both zero is the GPU
// tier alone.
type Tiers struct {
	HostX float64 `json:"host_x"`
	DiskX float64 `json:"disk_x"`
	// DiskDir holds the disk level's files; "" makes a temporary directory,
	// removed when the run ends.
	DiskDir string `json:"-"`
}

// On reports whether any cold level is configured.
func (t Tiers) On() bool { return t.HostX > 0 || t.DiskX > 0 }

// DefaultTiers: host 1× and disk 2× the GPU capacity. On W2 at 0.25× (GPU =
// a quarter of the distinct prefixes) all three together hold the footprint.
func DefaultTiers() Tiers { return Tiers{HostX: 1, DiskX: 2} }

// Link is the cost of moving KV between levels. The simulated manager keeps
// 8 bytes a block; the link charges BytesPerToken per token of each block
// moved, as the modelled GPU would copy.
//
// Transfers run on four channels, each one at a time in issue order, in
// parallel with compute: host→GPU (H2D), GPU→host (D2H), disk read and disk
// write. While both PCIe directions are busy each runs at
// min(its own rate, Duplex/2). A block onboarded from disk is read, then
// copied host→GPU as soon as it is read: the copies of a disk prefix take
// their share of H2D when issued, and the last lands a block's copy after
// the last read, so host blocks issued meanwhile do not wait for the disk.
// One offloaded to disk is copied GPU→host, then written.
// Offloads delay nothing but the onboarding that shares the link with them
// (the device writes an evicted page out before its slot is overwritten;
// the model does not charge that ordering).
//
// Defaults are from docs/benchmarks.md (H200, PCIe gen5 x16, 2026-12-01):
// 55 GB/s each way (the contiguous-copy limit, 53.1–55.4 GB/s measured),
// disk 2.05 GB/s read and 2.04 GB/s write (kvcm bench disk, 2 MiB blobs,
// gpu↔disk). Duplex (both directions at once) was not measured there:
// its default, 100 GB/s, is an assumption.
type Link struct {
	BytesPerToken float64 `json:"bytes_per_token"`
	H2D           float64 `json:"h2d_gbps"`
	D2H           float64 `json:"d2h_gbps"`
	Duplex        float64 `json:"duplex_gbps"`
	DiskRead      float64 `json:"disk_read_gbps"`
	DiskWrite     float64 `json:"disk_write_gbps"`
}

// DefaultLink: 128 KiB of KV a token (the cost model's 8B model with 16-bit
// KV) and the measured bandwidths above.
func DefaultLink() Link {
	return Link{BytesPerToken: 131072, H2D: 55, D2H: 55, Duplex: 100, DiskRead: 2.05, DiskWrite: 2.04}
}

// Validate checks every rate is positive.
func (l Link) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"bytes per token", l.BytesPerToken}, {"h2d", l.H2D}, {"d2h", l.D2H}, {"duplex", l.Duplex},
		{"disk read", l.DiskRead}, {"disk write", l.DiskWrite}} {
		if !(f.v > 0) {
			return fmt.Errorf("sim: link %s must be positive, got %v", f.name, f.v)
		}
	}
	return nil
}

// PrefetchOptions configures prefetch for waiting requests: each step, in
// arrival order, a waiting request whose cached prefix lies partly on a cold
// level (as the CP index reports it) has that prefix brought to the GPU
// through the manager's KVCache.Prefetch, where it stays evictable, within
// two budgets:
//
//   - pages: the blocks prefetched for requests still waiting stay under
//     Pages × the GPU capacity, and under the GPU's free-plus-evictable
//     pages less what running requests have reserved, so a prefetch never
//     takes a page a running request holds or will need;
//   - bandwidth: no prefetch is issued while the host→GPU channel is busy
//     more than Horizon seconds ahead.
type PrefetchOptions struct {
	On      bool    `json:"on"`
	Pages   float64 `json:"pages"`
	Horizon float64 `json:"horizon_s"`
}

// QueueEvictOptions configures eviction that knows the queue: each step the
// blocks waiting requests will reuse, as the CP index reports them
// (cp.QueueReuse, oldest waiter first), get eviction priority Priority
// (core.SetBlockPriorities), above the default of every other block, so
// they are evicted last, at every level; blocks nobody waits for any more go
// back to the default. At most Limit × the GPU capacity blocks are raised at
// once, so a flood of waiters cannot pin the cache. It needs the
// manager-backed index (with none or null nothing is raised).
type QueueEvictOptions struct {
	On       bool    `json:"on"`
	Limit    float64 `json:"limit"`
	Priority int     `json:"priority"`
}

// ReuseEvictOptions configures eviction that knows the workload's reuse
// (cp.ReuseEvict): a block a finished request leaves cached that nobody has
// reused since it was computed gets priority 15 and is evicted first, at
// every level; a reused block ranks from the default 35 up to 65 by its
// reuse count, decayed by half every HalfLife admissions; at most Limit ×
// the GPU capacity blocks rank above 35 at once. Priorities go to the
// manager through core.SetBlockPriorities; blocks queue-aware eviction
// protects keep its higher priority.
type ReuseEvictOptions struct {
	On       bool    `json:"on"`
	Limit    float64 `json:"limit"`
	HalfLife int     `json:"half_life"`
}

// DefaultReuseEvict: off; when on, twice the GPU capacity raised at most
// (on the default tiers, the GPU and host levels), counts halving every
// 1024 admissions.
func DefaultReuseEvict() ReuseEvictOptions { return ReuseEvictOptions{Limit: 2, HalfLife: 1024} }

// DefaultQueueEvict: off; when on, half the GPU at priority 70.
func DefaultQueueEvict() QueueEvictOptions { return QueueEvictOptions{Limit: 0.5, Priority: 70} }

// DefaultPrefetch: off; when on, a quarter of the GPU and 50 ms of link.
func DefaultPrefetch() PrefetchOptions { return PrefetchOptions{Pages: 0.25, Horizon: 0.05} }

// Serving is how a variant serves: the GPU tier alone or over the cold
// tiers, with or without prefetch (tiered only), queue-aware eviction and
// the choice between reading a cold prefix and recomputing it (tiered
// only).
type Serving struct {
	Tiered     bool
	Prefetch   bool
	QueueEvict bool
	ReuseEvict bool
	Overlap    bool
	Recompute  bool
}

// String is gpu or tiered, then +prefetch, +qevict, +reuse, +overlap and
// +recompute when on.
func (s Serving) String() string {
	out := "gpu"
	if s.Tiered {
		out = "tiered"
	}
	if s.Prefetch {
		out += "+prefetch"
	}
	if s.QueueEvict {
		out += "+qevict"
	}
	if s.ReuseEvict {
		out += "+reuse"
	}
	if s.Overlap {
		out += "+overlap"
	}
	if s.Recompute {
		out += "+recompute"
	}
	return out
}

// Variant is one line of an experiment: a policy served one way.
type Variant struct {
	Policy  sched.Policy
	Serving Serving
}

// String is POLICY@SERVING, or the policy alone on the GPU tier.
func (v Variant) String() string {
	if v.Serving == (Serving{}) {
		return v.Policy.String()
	}
	return v.Policy.String() + "@" + v.Serving.String()
}

// ParseVariant parses POLICY[@SERVING]; SERVING is gpu or tiered, then
// optionally, in this order, +prefetch (tiered only), +qevict, +reuse, and
// one of +overlap and +recompute (tiered only); no suffix: gpu.
func ParseVariant(s string) (Variant, error) {
	ps, ss, _ := strings.Cut(s, "@")
	p, err := sched.ParsePolicy(ps)
	if err != nil {
		return Variant{}, err
	}
	v := Variant{Policy: p}
	if ss == "" {
		return v, nil
	}
	parts := strings.Split(ss, "+")
	switch parts[0] {
	case "gpu":
	case "tiered":
		v.Serving.Tiered = true
	default:
		return Variant{}, fmt.Errorf("sim: variant %q: serving %q is not gpu or tiered", s, parts[0])
	}
	for _, x := range parts[1:] {
		switch {
		case x == "prefetch" && v.Serving.Tiered && !v.Serving.Prefetch && !v.Serving.QueueEvict && !v.Serving.Recompute:
			v.Serving.Prefetch = true
		case x == "qevict" && !v.Serving.QueueEvict && !v.Serving.ReuseEvict && !v.Serving.Overlap && !v.Serving.Recompute:
			v.Serving.QueueEvict = true
		case x == "reuse" && !v.Serving.ReuseEvict && !v.Serving.Overlap && !v.Serving.Recompute:
			v.Serving.ReuseEvict = true
		case x == "overlap" && v.Serving.Tiered && !v.Serving.Overlap && !v.Serving.Recompute:
			v.Serving.Overlap = true
		case x == "recompute" && v.Serving.Tiered && !v.Serving.Overlap && !v.Serving.Recompute:
			v.Serving.Recompute = true
		default:
			return Variant{}, fmt.Errorf("sim: variant %q: serving %q: want gpu|tiered, then +prefetch (tiered only), +qevict, +reuse, then +overlap or +recompute (tiered only)", s, ss)
		}
	}
	return v, nil
}

// apply sets o up for the variant: its policy, and the tiers and prefetch
// only when the variant asks for them.
func (v Variant) apply(o Options, tiers Tiers) Options {
	o.Policy = v.Policy
	o.Tiers = Tiers{}
	if v.Serving.Tiered {
		o.Tiers = tiers
	}
	o.Prefetch.On = v.Serving.Prefetch
	o.QueueEvict.On = v.Serving.QueueEvict
	o.ReuseEvict.On = v.Serving.ReuseEvict
	o.Recompute = v.Serving.Recompute
	o.Overlap = v.Serving.Overlap
	return o
}

// arrival returns when host and disk blocks of a request admitted at t
// would all be on the GPU if issued now, as issue would charge them
// (disk blocks first, then host ones), without charging them.
func (l *link) arrival(host, disk int, t float64) float64 {
	if host+disk == 0 {
		return t
	}
	rate := l.h2dRate(t)
	b := l.blockBytes
	h := max(t, l.h2d) + float64(disk+host)*b/(rate*1e9)
	if disk > 0 {
		r := max(t, l.dread) + float64(disk)*b/(l.cfg.DiskRead*1e9)
		h = max(h, r+b/(l.h2dRate(r)*1e9))
	}
	return h
}

// h2dRate is the host→GPU rate of a copy starting at t: shared with GPU→host
// if that direction is still busy then.
func (l *link) h2dRate(t float64) float64 {
	if l.d2h > t {
		return min(l.cfg.H2D, l.cfg.Duplex/2)
	}
	return l.cfg.H2D
}

// link is the transfer model's state: when each channel is free.
type link struct {
	cfg           Link
	h2d, d2h      float64
	dread, dwrite float64
	blockBytes    float64
	moved         [3][3]int64
}

// send queues bytes on channel ch (opposite: the other PCIe direction, or
// nil) at time t at rate gbps and returns when they have moved.
func (l *link) send(ch, opposite *float64, t, bytes, gbps float64) float64 {
	start := max(t, *ch)
	if opposite != nil && *opposite > start {
		gbps = min(gbps, l.cfg.Duplex/2)
	}
	*ch = start + bytes/(gbps*1e9)
	return *ch
}

// issue charges the moves m (blocks, by from and to level) made at time t and
// returns when the blocks brought to the GPU have arrived (t if none).
func (l *link) issue(m *[3][3]int64, t float64) float64 {
	b := l.blockBytes
	for from := range m {
		for to := range m[from] {
			l.moved[from][to] += m[from][to]
		}
	}
	if n := float64(m[0][1] + m[0][2]); n > 0 {
		l.send(&l.d2h, &l.h2d, t, n*b, l.cfg.D2H)
	}
	if n := float64(m[0][2]); n > 0 {
		l.send(&l.dwrite, nil, l.d2h, n*b, l.cfg.DiskWrite)
	}
	if n := float64(m[1][2]); n > 0 {
		l.send(&l.dwrite, nil, t, n*b, l.cfg.DiskWrite)
	}
	if n := float64(m[2][1]); n > 0 {
		l.send(&l.dread, nil, t, n*b, l.cfg.DiskRead)
	}
	ready := t
	if n := float64(m[2][0]); n > 0 {
		// Each block is copied to the GPU as soon as it is read: the
		// copies take their share of host→GPU now, not once every read is
		// done (which would hold up host blocks issued meanwhile), and the
		// last one lands a block's copy after the last read.
		r := l.send(&l.dread, nil, t, n*b, l.cfg.DiskRead)
		c := l.send(&l.h2d, &l.d2h, t, n*b, l.cfg.H2D)
		ready = max(ready, c, r+b/(l.h2dRate(r)*1e9))
	}
	if n := float64(m[1][0]); n > 0 {
		ready = max(ready, l.send(&l.h2d, &l.d2h, t, n*b, l.cfg.H2D))
	}
	*m = [3][3]int64{}
	return ready
}
