package core

import (
	"fmt"

	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// Eviction: making room on a level. Victims are taken from each pool group's
// heap (priority, then least recently released, then deepest first), fall to
// the next level (encoded on the way down from the GPU) or, on the last
// level, are dropped when nobody holds them.

// fitAt returns the pages level li can take, as far as its free and
// evictable slots go.
func (m *Manager) fitAt(li int, pages []*page) []*page {
	lvl := m.levels[li]
	room := map[*slotGroup]int{}
	var fit []*page
	for _, p := range pages {
		g := lvl.groupOf(p.lc)
		if _, ok := room[g]; !ok {
			room[g] = g.free.len() + g.victims.len()
		}
		if room[g] > 0 {
			room[g]--
			fit = append(fit, p)
		}
	}
	return fit
}

// reserveAt makes sure every group of n at level li has enough free slots.
// Victims fall to the next level (a hot page is encoded on the way); on the
// last level, or when the next level cannot take them, pages nobody holds are
// dropped. A held victim that cannot leave (its migration failed) stays where
// it is and the next victim is tried. It fails, evicting nothing, when the
// free and evictable slots of a group cannot cover its need, and otherwise
// with an error naming why the victims could not leave.
func (m *Manager) reserveAt(li int, n need) error {
	for _, x := range n {
		if g, k := x.g, x.k; g.free.len()+g.victims.len() < k {
			return fmt.Errorf("%w: %v pool group %d needs %d slots, %d free and %d evictable of %d",
				ErrOutOfPages, g.level.kind, g.desc.Index, k, g.free.len(), g.victims.len(), g.numSlots)
		}
	}
	var causes []error
	var stuck []*page // victims that could not leave: out of the victim set until we are done
	defer func() {
		for _, v := range stuck {
			v.refresh()
		}
	}()
	lvl := m.levels[li]
	for {
		// The level's scratch: a migration down reserves on colder
		// levels only.
		victims := lvl.victimScratch[:0]
		for _, x := range n {
			g, k := x.g, x.k
			for taken := 0; g.free.len()+taken < k && g.victims.len() > 0; taken++ {
				victims = append(victims, g.victims.pop())
			}
		}
		lvl.victimScratch = victims
		if len(victims) == 0 {
			break
		}
		// Victims fall to the next level; what it cannot take falls further.
		rest := victims
		for next := li + 1; next < len(m.levels) && len(rest) > 0; next++ {
			if err := m.migrate(m.fitAt(next, rest), next); err != nil {
				causes = append(causes, err)
			}
			still := rest[:0:0]
			for _, v := range rest {
				if v.group.level.index == li {
					still = append(still, v)
				}
			}
			rest = still
		}
		for _, v := range victims {
			switch {
			case v.group.level.index != li:
				m.stats.onEvict()
			case v.held == 0 && v.active == 0 && v.node != nil:
				m.writeBack(v)
				m.drop(v)
				m.stats.onEvict()
			default:
				if v.inVictims() {
					v.group.victims.remove(v)
				}
				stuck = append(stuck, v)
			}
		}
	}
	for _, x := range n {
		if g, k := x.g, x.k; g.free.len() < k {
			why := "the next level could not take the held pages"
			if len(causes) > 0 {
				return fmt.Errorf("%w: %v pool group %d needs %d slots; %s: %w",
					ErrOutOfPages, g.level.kind, g.desc.Index, k, why, joinErrs(causes))
			}
			return fmt.Errorf("%w: %v pool group %d needs %d slots; %s", ErrOutOfPages, g.level.kind, g.desc.Index, k, why)
		}
	}
	return nil
}

// need counts slots to take per group of one level.
type need []groupNeed

type groupNeed struct {
	g *slotGroup
	k int
}

// add counts k more slots of g.
func (n need) add(g *slotGroup, k int) need {
	for i := range n {
		if n[i].g == g {
			n[i].k += k
			return n
		}
	}
	return append(n, groupNeed{g, k})
}

// drop removes an unreferenced tree page from storage and from its node.
func (m *Manager) drop(p *page) {
	if p.inVictims() {
		p.group.victims.remove(p)
	}
	n := p.node
	m.pagesOf(n)[p.lc] = nil
	from := layout.CacheLevel(p.level())
	if p.group.level.kind == config.HostTier {
		st := &m.stats.lc[p.lc]
		st.HostDroppedBlocks++
		st.HostDroppedBytes += m.lcCodec[p.lc].coldBytes
	}
	p.group.release(p)
	p.node, p.inflight = nil, nil
	m.pages.release(p)
	m.emitDropped(n, p.lc, from)
	if !m.hasPages(n) {
		m.prune = append(m.prune, n)
	}
}
