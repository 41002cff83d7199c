package cp

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// External is an external prefix-reuse index given as optional functions,
// one per method of CPAwareKVManager, the way a C vtable gives nullable
// slots or a Python object may lack attributes. A nil function is a missing
// method. Functions may return errors and may panic; Delegating contains
// both.
type External struct {
	PredictPrefixReuse    func(requestID string, tokens []config.Token) (float64, error)
	GetCPCachedBlocks     func(requestID string) ([]blockhash.Key, error)
	NotifyBlocksAllocated func(requestID string, keys []blockhash.Key) error
	NotifyBlocksFreed     func(requestID string, keys []blockhash.Key) error
	GetAllocationPriority func(requestIDs []string) ([]string, error)
	// Generation, if present, changes whenever the index's scores may have
	// changed (see Generational).
	Generation func() (uint64, error)
}

// Capabilities says which methods an External provides.
type Capabilities struct {
	PredictPrefixReuse    bool
	GetCPCachedBlocks     bool
	NotifyBlocksAllocated bool
	NotifyBlocksFreed     bool
	GetAllocationPriority bool
	Generation            bool
}

// DelegatingOptions configures NewDelegating.
type DelegatingOptions struct {
	// OrderByScores: when the external index has no GetAllocationPriority
	// (or it fails), order by the last scores PredictPrefixReuse returned
	// instead of the input order. Off by default: the missing method then
	// behaves exactly as Null's.
	OrderByScores bool
	// OnFault, if set, is called (without locks held) with a description of
	// every error, panic or invalid value the external index produced.
	OnFault func(method string, problem string)
}

// Delegating forwards each method to an External and guarantees the
// interface contract whatever the external index does:
//   - a missing method behaves as Null's (score 0, no blocks, no-op, input
//     order);
//   - a score is clamped into [0, 1], NaN becomes 0;
//   - an error or a panic is contained and answered with the Null behaviour;
//   - GetAllocationPriority always returns a permutation of its input: ids
//     the external index invents or repeats are dropped, ids it omits are
//     appended in input order;
//   - returned block lists are copies.
//
// Without an external Generation, Generation advances on every notification
// passed through: the cache changes this adapter sees.
type Delegating struct {
	ext    External
	opts   DelegatingOptions
	faults atomic.Uint64
	notes  atomic.Uint64

	// genMu guards the generation: it advances whenever the external
	// generation or the notification count differs from the last seen.
	genMu              sync.Mutex
	lastExt, lastNotes uint64
	gen                uint64

	mu     sync.Mutex
	scores map[string]float64
}

var (
	_ CPAwareKVManager = (*Delegating)(nil)
	_ Generational     = (*Delegating)(nil)
	_ ScoreReleaser    = (*Delegating)(nil)
)

// NewDelegating wraps ext.
func NewDelegating(ext External, opts DelegatingOptions) *Delegating {
	return &Delegating{ext: ext, opts: opts, scores: map[string]float64{}}
}

// Capabilities reports which methods the wrapped index provides.
func (d *Delegating) Capabilities() Capabilities {
	return Capabilities{
		PredictPrefixReuse:    d.ext.PredictPrefixReuse != nil,
		GetCPCachedBlocks:     d.ext.GetCPCachedBlocks != nil,
		NotifyBlocksAllocated: d.ext.NotifyBlocksAllocated != nil,
		NotifyBlocksFreed:     d.ext.NotifyBlocksFreed != nil,
		GetAllocationPriority: d.ext.GetAllocationPriority != nil,
		Generation:            d.ext.Generation != nil,
	}
}

// Faults counts errors, panics and invalid values the external index
// produced so far.
func (d *Delegating) Faults() uint64 { return d.faults.Load() }

func (d *Delegating) fault(method, problem string) {
	d.faults.Add(1)
	if d.opts.OnFault != nil {
		func() {
			defer func() { _ = recover() }()
			d.opts.OnFault(method, problem)
		}()
	}
}

// guard runs fn, turning a panic or error into a fault. It reports success.
func (d *Delegating) guard(method string, fn func() error) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			d.fault(method, fmt.Sprintf("panic: %v", p))
			ok = false
		}
	}()
	if err := fn(); err != nil {
		d.fault(method, "error: "+err.Error())
		return false
	}
	return true
}

// PredictPrefixReuse returns the external score clamped into [0, 1]; 0 when
// the method is missing or fails.
func (d *Delegating) PredictPrefixReuse(requestID string, tokens []config.Token) float64 {
	if d.ext.PredictPrefixReuse == nil {
		return 0
	}
	var raw float64
	if !d.guard("PredictPrefixReuse", func() (err error) {
		// A copy: the external index must not be able to change the prompt.
		raw, err = d.ext.PredictPrefixReuse(requestID, slices.Clone(tokens))
		return err
	}) {
		raw = 0
	}
	s := ClampScore(raw)
	if s != raw {
		d.fault("PredictPrefixReuse", fmt.Sprintf("score %v out of [0,1], clamped to %v", raw, s))
	}
	if d.opts.OrderByScores {
		d.mu.Lock()
		d.scores[requestID] = s
		d.mu.Unlock()
	}
	return s
}

// GetCPCachedBlocks returns a copy of the external list; nil when missing or
// failing.
func (d *Delegating) GetCPCachedBlocks(requestID string) []blockhash.Key {
	if d.ext.GetCPCachedBlocks == nil {
		return nil
	}
	var keys []blockhash.Key
	if !d.guard("GetCPCachedBlocks", func() (err error) {
		keys, err = d.ext.GetCPCachedBlocks(requestID)
		return err
	}) {
		return nil
	}
	return slices.Clone(keys)
}

// NotifyBlocksAllocated forwards the notification; failures are contained.
func (d *Delegating) NotifyBlocksAllocated(requestID string, keys []blockhash.Key) {
	d.notes.Add(1)
	if d.ext.NotifyBlocksAllocated != nil {
		d.guard("NotifyBlocksAllocated", func() error { return d.ext.NotifyBlocksAllocated(requestID, keys) })
	}
}

// NotifyBlocksFreed forwards the terminal free; failures are contained.
func (d *Delegating) NotifyBlocksFreed(requestID string, keys []blockhash.Key) {
	d.notes.Add(1)
	d.ReleaseScore(requestID)
	if d.ext.NotifyBlocksFreed != nil {
		d.guard("NotifyBlocksFreed", func() error { return d.ext.NotifyBlocksFreed(requestID, keys) })
	}
}

// ReleaseScore drops the remembered score of the request (OrderByScores).
func (d *Delegating) ReleaseScore(requestID string) {
	if d.opts.OrderByScores {
		d.mu.Lock()
		delete(d.scores, requestID)
		d.mu.Unlock()
	}
}

// GetAllocationPriority returns the external order repaired into a
// permutation of requestIDs, or the fallback order when the method is
// missing or fails.
func (d *Delegating) GetAllocationPriority(requestIDs []string) []string {
	if requestIDs == nil {
		return nil
	}
	if d.ext.GetAllocationPriority != nil {
		var order []string
		if d.guard("GetAllocationPriority", func() (err error) {
			order, err = d.ext.GetAllocationPriority(slices.Clone(requestIDs))
			return err
		}) {
			out := RepairOrder(requestIDs, order)
			if !slices.Equal(out, order) {
				d.fault("GetAllocationPriority", "result was not a permutation of the input; repaired")
			}
			return out
		}
	}
	if !d.opts.OrderByScores {
		return slices.Clone(requestIDs)
	}
	d.mu.Lock()
	sc := make([]float64, len(requestIDs))
	for i, id := range requestIDs {
		sc[i] = d.scores[id]
	}
	d.mu.Unlock()
	idx := make([]int, len(requestIDs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case sc[a] > sc[b]:
			return -1
		case sc[a] < sc[b]:
			return 1
		}
		return 0
	})
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = requestIDs[j]
	}
	return out
}

// Generation changes whenever the external generation or the count of
// notifications passed through changes. Without an external Generation (or
// when it fails) only the notifications count.
func (d *Delegating) Generation() uint64 {
	own := d.notes.Load()
	var g uint64
	if d.ext.Generation != nil && !d.guard("Generation", func() (err error) {
		g, err = d.ext.Generation()
		return err
	}) {
		g = d.lastExt // a failing index changes nothing
	}
	d.genMu.Lock()
	defer d.genMu.Unlock()
	if g != d.lastExt || own != d.lastNotes {
		d.lastExt, d.lastNotes = g, own
		d.gen++
	}
	return d.gen
}
