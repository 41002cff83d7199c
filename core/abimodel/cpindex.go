package abimodel

import (
	"sync/atomic"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/cp"
)

// CPIndex is a kvcm_cp_index: a CP-aware index shared by its creator (until
// Destroy), by the managers it is attached to and by the caches created
// while it was attached. The last of them to let go closes it: a delegating
// index's destroy function runs then, exactly once, and a manager-backed
// index stops receiving its manager's events. Its methods are safe for
// concurrent use; after Destroy they fail with ErrDestroyed.
type CPIndex struct {
	index     cp.CPAwareKVManager
	deleg     *cp.Delegating // delegating indexes only
	onClose   func()         // runs when the last reference goes
	refs      atomic.Int64
	destroyed atomic.Bool // Destroy dropped the creator's reference
	closed    atomic.Bool
}

func newCPIndex(index cp.CPAwareKVManager) *CPIndex {
	x := &CPIndex{index: index}
	x.refs.Store(1) // the creator's
	return x
}

// NewNullIndex returns an index that knows nothing (cp.Null).
func NewNullIndex() *CPIndex { return newCPIndex(cp.Null{}) }

// NewDelegatingIndex returns an index that delegates to an external one
// (cp.Delegating over ext); destroy, if set, runs once when the last
// reference goes.
func NewDelegatingIndex(ext cp.External, destroy func()) *CPIndex {
	d := cp.NewDelegating(ext, cp.DelegatingOptions{})
	x := newCPIndex(d)
	x.deleg, x.onClose = d, destroy
	return x
}

// NewManagerBackedIndex returns an index backed by the manager's own block
// index (cp.ManagerBacked). It must see every event of the manager, so it
// fails with core.ErrInvalidState once the manager has stored a block. Once
// the manager is closed it answers as cp.Null.
func (mgr *Manager) NewManagerBackedIndex(opts cp.ManagerBackedOptions) (*CPIndex, error) {
	mb := cp.NewManagerBacked(opts)
	remove, err := mgr.Listen(mb.Listener())
	if err != nil {
		return nil, err
	}
	mb.Attach(mgr.m)
	x := newCPIndex(managerBacked{x: mb, mgr: mgr})
	x.onClose = remove
	return x, nil
}

// managerBacked is a ManagerBacked index that answers as Null once its
// manager is closed.
type managerBacked struct {
	x   *cp.ManagerBacked
	mgr *Manager
}

var _ cp.CPAwareKVManager = managerBacked{}

func (m managerBacked) PredictPrefixReuse(id string, tokens []config.Token) float64 {
	if m.mgr.closed.Load() {
		return 0
	}
	return m.x.PredictPrefixReuse(id, tokens)
}

func (m managerBacked) GetCPCachedBlocks(id string) []blockhash.Key {
	if m.mgr.closed.Load() {
		return nil
	}
	return m.x.GetCPCachedBlocks(id)
}

func (m managerBacked) NotifyBlocksAllocated(id string, keys []blockhash.Key) {
	m.x.NotifyBlocksAllocated(id, keys)
}

func (m managerBacked) NotifyBlocksFreed(id string, keys []blockhash.Key) {
	m.x.NotifyBlocksFreed(id, keys)
}

func (m managerBacked) GetAllocationPriority(ids []string) []string {
	if m.mgr.closed.Load() {
		return cp.Null{}.GetAllocationPriority(ids)
	}
	return m.x.GetAllocationPriority(ids)
}

// Destroy drops the creator's reference; the index closes when no manager
// or cache holds it either. A second Destroy fails with ErrDestroyed.
func (x *CPIndex) Destroy() error {
	if !x.destroyed.CompareAndSwap(false, true) {
		return destroyedErr("cp: the index was already destroyed")
	}
	x.release()
	return nil
}

// Closed reports whether the last reference is gone.
func (x *CPIndex) Closed() bool { return x.closed.Load() }

// acquire takes a reference for a holder that already has one (a manager
// passing on its attached index).
func (x *CPIndex) acquire() { x.refs.Add(1) }

// tryAcquire takes a reference unless the creator destroyed the index or
// the last reference is gone; a count once dropped to 0 never comes back.
func (x *CPIndex) tryAcquire() bool {
	for {
		n := x.refs.Load()
		if n <= 0 || x.destroyed.Load() || x.closed.Load() {
			return false
		}
		if x.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release drops one reference; the last closes the index.
func (x *CPIndex) release() {
	if x.refs.Add(-1) != 0 || !x.closed.CompareAndSwap(false, true) {
		return
	}
	if x.onClose != nil {
		x.onClose()
	}
}

// use holds a reference for the duration of a call, so that a concurrent
// Destroy cannot close the index under it (the last release, by done,
// closes it then).
func (x *CPIndex) use() (done func(), err error) {
	if !x.tryAcquire() {
		return nil, destroyedErr("cp: the index was destroyed")
	}
	return x.release, nil
}

// PredictPrefixReuse returns the index's score for a request, clamped to
// [0, 1] (NaN is 0).
func (x *CPIndex) PredictPrefixReuse(requestID string, tokens []config.Token) (float64, error) {
	done, err := x.use()
	if err != nil {
		return 0, err
	}
	defer done()
	return cp.ClampScore(x.index.PredictPrefixReuse(requestID, tokens)), nil
}

// GetCachedBlocks returns the keys of the blocks the index says are cached
// for a request.
func (x *CPIndex) GetCachedBlocks(requestID string) ([]blockhash.Key, error) {
	done, err := x.use()
	if err != nil {
		return nil, err
	}
	defer done()
	return x.index.GetCPCachedBlocks(requestID), nil
}

// NotifyBlocksAllocated tells the index a request holds these blocks.
func (x *CPIndex) NotifyBlocksAllocated(requestID string, keys []blockhash.Key) error {
	done, err := x.use()
	if err != nil {
		return err
	}
	defer done()
	x.index.NotifyBlocksAllocated(requestID, keys)
	return nil
}

// NotifyBlocksFreed tells the index a request let go of these blocks.
func (x *CPIndex) NotifyBlocksFreed(requestID string, keys []blockhash.Key) error {
	done, err := x.use()
	if err != nil {
		return err
	}
	defer done()
	x.index.NotifyBlocksFreed(requestID, keys)
	return nil
}

// RequestID is a kvcm_cp_request_id: one request's id.
type RequestID struct{ ID string }

// GetAllocationPriority returns the order in which the requests should get
// pages, as indices into reqs: a permutation, whatever the index answered
// (cp.RepairOrder drops unknown and repeated ids and appends missing ones);
// equal ids take their indices in input order.
func (x *CPIndex) GetAllocationPriority(reqs []RequestID) ([]int, error) {
	done, err := x.use()
	if err != nil {
		return nil, err
	}
	defer done()
	if len(reqs) == 0 {
		return nil, nil
	}
	ids := make([]string, len(reqs))
	for i, r := range reqs {
		ids[i] = r.ID
	}
	got := cp.RepairOrder(ids, x.index.GetAllocationPriority(ids))
	pos := make(map[string][]int, len(ids))
	for i, id := range ids {
		pos[id] = append(pos[id], i)
	}
	order := make([]int, len(got))
	for i, id := range got {
		q := pos[id]
		order[i] = q[0]
		pos[id] = q[1:]
	}
	return order, nil
}

// FaultCount returns how many calls a delegating index's external index
// failed (0 for other kinds).
func (x *CPIndex) FaultCount() (uint64, error) {
	done, err := x.use()
	if err != nil {
		return 0, err
	}
	defer done()
	if x.deleg == nil {
		return 0, nil
	}
	return x.deleg.Faults(), nil
}
