package sim

import (
	"fmt"
	"slices"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/cp"
	"github.com/kvcm/kvcm/core/layout"
)

// levelIndex is the part of a CP index that knows each cached block's level
// (cp.ManagerBacked).
type levelIndex interface {
	BlockLevels(key blockhash.Key) ([]int32, bool)
}

// level returns the level of a cached block as the CP index reports it (the
// simulator's mirror without a manager-backed index), and whether it is
// cached.
func (e *engine) level(k blockhash.Key) (int, bool) {
	if e.levels != nil {
		lv, ok := e.levels.BlockLevels(k)
		if !ok || len(lv) == 0 || lv[0] < 0 {
			return 0, false
		}
		return int(lv[0]), true
	}
	lv, ok := e.cached[k]
	return lv, ok
}

// prefetch brings the cold cached prefixes of waiting requests to the GPU,
// oldest waiter first, within the budgets of PrefetchOptions (as much of a
// prefix, from its start, as the pages budget leaves room for). A prefetched
// block is evictable on the GPU, so it takes only free or evictable pages;
// the pages budget keeps the prefetched blocks of all waiters under both
// Pages × the GPU capacity and the free-plus-evictable pages running
// requests have not reserved.
func (e *engine) prefetch() {
	po := e.opts.Prefetch
	limit := int(po.Pages * float64(e.res.CapacityBlocks))
	for _, id := range e.sch.Waiting() {
		if e.link.h2d > e.t+po.Horizon {
			return
		}
		j := e.byID[id]
		// The longest cached prefix whose cold blocks fit the budget.
		room := min(limit-e.prefetchN, e.available()-e.outstanding)
		var coldKeys []blockhash.Key
		n := 0
		for ; n < len(j.chain); n++ {
			lv, ok := e.level(j.chain[n])
			if !ok || lv > 0 && len(coldKeys) == room {
				break
			}
			if lv > 0 {
				coldKeys = append(coldKeys, j.chain[n])
			}
		}
		cold := len(coldKeys)
		if cold == 0 {
			continue
		}
		c, err := e.m.CreateKVCache(core.CacheOptions{InputTokens: j.prompt[:n*e.tpb]})
		if err != nil {
			e.fail(fmt.Errorf("sim: prefetch for %q: %w", id, err))
			return
		}
		err = c.Prefetch(layout.GPULevel)
		ready := e.charge()
		if cerr := c.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			e.fail(fmt.Errorf("sim: prefetch for %q: %w", id, err))
			return
		}
		for _, k := range coldKeys {
			if lv, ok := e.cached[k]; ok && lv == 0 {
				e.readyAt[k] = ready
			}
		}
		j.prefetched += cold
		e.prefetchN += cold
		e.res.Prefetched += int64(cold)
	}
}

// checkRunning fails the run when a running request's reused or committed
// block is not on the GPU, the GPU cannot cover the pages running requests
// have reserved, or prefetch is over its pages budget.
func (e *engine) checkRunning() {
	for k, n := range e.pins {
		if lv, ok := e.cached[k]; n > 0 && (!ok || lv != 0) {
			e.fail(fmt.Errorf("sim: a block a running request holds is not on the GPU (cached %v, level %d)", ok, lv))
			return
		}
	}
	if a := e.available(); a < e.outstanding {
		e.fail(fmt.Errorf("sim: %d free or evictable GPU pages cannot cover the %d running requests reserved", a, e.outstanding))
	}
	if limit := int(e.opts.Prefetch.Pages * float64(e.res.CapacityBlocks)); e.opts.Prefetch.On && e.prefetchN > limit {
		e.fail(fmt.Errorf("sim: %d blocks prefetched for waiting requests, over the budget of %d", e.prefetchN, limit))
	}
}

// restPriority is the priority of a block queue-aware eviction does not
// protect: the reuse-aware policy's, or the default.
func (e *engine) restPriority(k blockhash.Key) int {
	if e.reuse != nil {
		if p, ok := e.reuse.Priority(k); ok {
			return p
		}
	}
	return core.DefaultPriority
}

// setPriorities applies the reuse-aware policy's updates; a block
// queue-aware eviction protects keeps its priority if that is higher.
func (e *engine) setPriorities(us ...cp.PriorityUpdate) {
	for _, u := range us {
		prs := u.Priorities
		if len(e.guarded) > 0 {
			prs = slices.Clone(prs)
			for i, k := range u.Chain {
				if _, ok := e.guarded[k]; ok {
					prs[i] = max(prs[i], e.opts.QueueEvict.Priority)
				}
			}
		}
		if _, err := e.m.SetBlockPriorities(blockhash.Scope{}, u.Chain, prs); err != nil {
			e.fail(fmt.Errorf("sim: reuse-aware eviction: %w", err))
			return
		}
	}
}

// protectQueue raises the eviction priority of the blocks waiting requests
// will reuse (cp.QueueReuse, within QueueEvictOptions.Limit) and returns
// the blocks nobody waits for any more to the default priority.
func (e *engine) protectQueue() {
	qo := e.opts.QueueEvict
	ids := e.sch.Waiting()
	ws := make([]cp.Waiter, len(ids))
	for i, id := range ids {
		ws[i] = cp.Waiter{ID: id, Tokens: e.byID[id].prompt}
	}
	lists := cp.QueueReuse(e.tracker.CP(), ws, int(qo.Limit*float64(e.res.CapacityBlocks)))
	want := map[blockhash.Key]struct{}{}
	next := make(map[string][]blockhash.Key, len(ids))
	for i, l := range lists {
		if len(l) == 0 {
			continue
		}
		next[ids[i]] = l
		for _, k := range l {
			want[k] = struct{}{}
		}
	}
	set := func(chain []blockhash.Key, pr func(k blockhash.Key) int) {
		prs := make([]int, len(chain))
		for i, k := range chain {
			prs[i] = pr(k)
		}
		if _, err := e.m.SetBlockPriorities(blockhash.Scope{}, chain, prs); err != nil {
			e.fail(fmt.Errorf("sim: queue-aware eviction: %w", err))
		}
	}
	e.guarded = want
	for id, old := range e.protected {
		if slices.Equal(old, next[id]) {
			continue
		}
		set(old, func(k blockhash.Key) int {
			if _, ok := want[k]; ok {
				return qo.Priority
			}
			return e.restPriority(k)
		})
	}
	for id, l := range next {
		if !slices.Equal(l, e.protected[id]) {
			set(l, func(blockhash.Key) int { return qo.Priority })
		}
	}
	e.protected = next
	e.res.Protected = max(e.res.Protected, len(want))
}
