package core

import (
	"fmt"
	"math"
	"time"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// Pool rebalancing (KVCacheManagerV2's need_adjustment and adjust). Each
// level's quota is split among its pool groups by one byte weight per layer
// group: at construction from the configuration (ByteWeights). Closing caches
// sample the lengths requests really have: the mean of each cache's
// capacities and history lengths, into moving averages of their squares
// (longer requests live longer but are sampled once), and every cache's
// reused length at creation. Every rebalance_target_ratio_update_interval
// samples the target weights are derived from them: the GPU level's from
// the pages a request of the average history and capacity holds per layer
// group, the cold levels' from those of a request of the average reused
// length. Adjust moves each level whose pool groups are off their target
// sizes to them, within the level's quota.

// movingAverage is an exponentially weighted mean, exact from the first
// sample on (the weights are normalized).
type movingAverage struct {
	decay, avg, weight float64
}

func (a *movingAverage) update(v float64) {
	a.weight = 1 + a.decay*a.weight
	a.avg += (v - a.avg) / a.weight
}

// mean is a plain running mean.
type mean struct {
	sum float64
	n   int
}

func (a *mean) update(v float64) { a.sum, a.n = a.sum+v, a.n+1 }

func (a *mean) value() float64 {
	if a.n == 0 {
		return 0
	}
	return a.sum / float64(a.n)
}

// rebalancer is the manager's sampling state.
type rebalancer struct {
	reused, sqrCapacity, sqrHistory movingAverage
	sampled, lastUpdate             int64
	lastAdjust                      time.Time
	// target is, per level, the layer groups' byte weights the level should
	// be split by; nil until the first update gave one.
	target [][]float64
	// weights is, per level, the byte weights the level is split by now.
	weights [][]float64
}

func newRebalancer(cfg *config.Config, weights []float64, levels int, now time.Time) rebalancer {
	d := cfg.MovingAverageDecay()
	r := rebalancer{
		reused: movingAverage{decay: d}, sqrCapacity: movingAverage{decay: d}, sqrHistory: movingAverage{decay: d},
		lastAdjust: now, target: make([][]float64, levels), weights: make([][]float64, levels),
	}
	for i := range r.weights {
		r.weights[i] = weights
	}
	return r
}

// sampleCreate samples a new cache's reused length.
func (c *KVCache) sampleCreate() {
	c.m.rebalance.reused.update(float64(c.history))
	c.avgHistory.update(float64(c.history))
}

// sampleResize samples a Resize's capacity and, when given, history length.
func (c *KVCache) sampleResize(capacity, history int, historyGiven bool) {
	c.avgCapacity.update(float64(capacity))
	if historyGiven {
		c.avgHistory.update(float64(history))
	}
}

// sampleClose samples a closing cache that ever had a capacity.
func (c *KVCache) sampleClose() {
	if c.capacity == 0 {
		return
	}
	r := &c.m.rebalance
	c.avgCapacity.update(float64(c.capacity))
	r.sqrCapacity.update(math.Pow(c.avgCapacity.value(), 2))
	r.sqrHistory.update(math.Pow(c.avgHistory.value(), 2))
	r.sampled++
	c.m.updateTargets()
}

// updateTargets derives the target weights every update interval.
func (m *Manager) updateTargets() {
	r := &m.rebalance
	if r.sampled-r.lastUpdate < m.cfg.TargetRatioUpdateInterval() {
		return
	}
	r.lastUpdate = r.sampled
	capacity := int(math.Round(math.Sqrt(r.sqrCapacity.avg)))
	history := int(math.Round(math.Sqrt(r.sqrHistory.avg)))
	reused := int(math.Round(r.reused.avg))
	if capacity > 0 {
		r.target[0] = m.weightsFor(history, capacity)
	}
	if reused > 0 {
		w := m.weightsFor(reused, reused)
		for i := 1; i < len(r.target); i++ {
			r.target[i] = w
		}
	}
}

// weightsFor returns the byte weights of a request of capacity tokens with
// history computed: per layer group the pages it holds (at least one) times
// the page bytes, normalized.
func (m *Manager) weightsFor(history, capacity int) []float64 {
	capacity = max(capacity, history)
	w := make([]float64, len(m.lt.LifeCycles))
	var sum float64
	for lc := range w {
		pages := m.lt.PagesNeeded(layout.LayerGroupID(lc), config.RequestDesc{Capacity: capacity, HistoryLength: history})
		w[lc] = float64(max(pages, 1)) * float64(m.lt.LifeCycles[lc].PageBytes())
		sum += w[lc]
	}
	for lc := range w {
		w[lc] /= sum
	}
	return w
}

// adjustment returns the slots each pool group of lvl gets by its target
// weights, or nil when the level has no target, the target cannot be had
// (a GPU pool group would pass the slots cache_tiers[0].max_quota
// reserved) or every group is within the ratio threshold of it already.
func (m *Manager) adjustment(lvl *storageLevel) []int64 {
	w := m.rebalance.target[lvl.index]
	if w == nil {
		return nil
	}
	target, err := m.slotsBy(lvl, lvl.quota, w)
	if err != nil {
		return nil
	}
	thr := m.cfg.RatioThreshold()
	for i, g := range lvl.groups {
		if r := float64(target[i]) / float64(g.numSlots); !(1/thr < r && r < thr) {
			return target
		}
	}
	return nil
}

// NeedAdjustment reports whether Adjust would resize some level's pool
// groups now (KVCacheManagerV2's need_adjustment): at least
// rebalance_min_sampled_kv_caches caches were sampled, the last Adjust (or
// the construction) is rebalance_cooldown_secs ago and some level's target
// split is off a pool group's size by the ratio threshold. A GPU target
// beyond the slots cache_tiers[0].max_quota reserved does not count: the
// GPU level rebalances within them.
func (m *Manager) NeedAdjustment() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	r := &m.rebalance
	if r.sampled < m.cfg.RebalanceMinSampledKVCaches ||
		m.now().Sub(r.lastAdjust).Seconds() < m.cfg.RebalanceCooldownSecs {
		return false
	}
	for _, lvl := range m.levels {
		if m.adjustment(lvl) != nil {
			return true
		}
	}
	return false
}

// Adjust resizes the pool groups of every level that is off its target
// split (see NeedAdjustment, less the sample and cooldown conditions) to it,
// keeping the level's quota, as ResizeLevel does: pages in slots that go
// move, with their bytes, into slots that stay (evicting what does not fit
// to colder levels, never a page a cache holds), GPU pools grow and shrink
// in place so base addresses and ACTIVE caches' page indices stay valid. A
// level whose adjustment fails (a shrinking group with more busy slots
// than it keeps, or an ACTIVE cache pinning a slot that would go) is left as
// it was and the error returned after the other levels were adjusted; later
// ResizeLevel calls split the quota by the adjusted weights. Adjust restarts
// the cooldown.
func (m *Manager) Adjust() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return err
	}
	m.settle()
	var first error
	for _, lvl := range m.levels {
		target := m.adjustment(lvl)
		if target == nil {
			continue
		}
		if err := m.resizeLevel(lvl, lvl.quota, target); err != nil {
			if first == nil {
				first = fmt.Errorf("adjust: %w", err)
			}
			continue
		}
		m.rebalance.weights[lvl.index] = m.rebalance.target[lvl.index]
	}
	m.rebalance.lastAdjust = m.now()
	return first
}

// RebalanceSamples returns how many closed caches were sampled.
func (m *Manager) RebalanceSamples() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rebalance.sampled
}
