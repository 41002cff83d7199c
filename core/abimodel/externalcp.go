package abimodel

import (
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/cp"
)

// ExternalCP is a CP index a user gives as a vtable (kvcm_cp_index_vtable:
// an index written in C, C++ or Python): its slots as funcs, nil where the
// vtable has none. capi's goCallerCPIndexVtable (generated from
// //kvcm:gocaller) fills it with funcs that call the C slots;
// NewExternalIndex makes it a kvcm_cp_index.
type ExternalCP struct {
	PredictPrefixReuse    func(requestID string, tokens []config.Token) (float64, error)
	GetCPCachedBlocks     func(requestID string) ([]blockhash.Key, error)
	NotifyBlocksAllocated func(requestID string, keys []blockhash.Key) error
	NotifyBlocksFreed     func(requestID string, keys []blockhash.Key) error
	// GetAllocationPriority returns the order of ids as indices into ids,
	// one per id; what the slot left unwritten is out of range.
	GetAllocationPriority func(ids []RequestID) ([]uint64, error)
	Destroy               func()
}

// NewExternalIndex returns the delegating index over ext (see
// NewDelegatingIndex: a missing slot behaves as the null index's, failures
// are contained and counted). Its rules: get_allocation_priority is not
// called for no ids, and its indices become the ids they name, those out
// of range dropped (the order is then repaired: the omitted ids follow in
// input order, a fault counted); Destroy runs once, when the last
// reference goes (a vtable taken but refused is destroyed by its taker).
func NewExternalIndex(ext ExternalCP) *CPIndex {
	e := cp.External{
		PredictPrefixReuse:    ext.PredictPrefixReuse,
		GetCPCachedBlocks:     ext.GetCPCachedBlocks,
		NotifyBlocksAllocated: ext.NotifyBlocksAllocated,
		NotifyBlocksFreed:     ext.NotifyBlocksFreed,
	}
	if slot := ext.GetAllocationPriority; slot != nil {
		e.GetAllocationPriority = func(ids []string) ([]string, error) {
			if len(ids) == 0 {
				return ids, nil
			}
			in := make([]RequestID, len(ids))
			for i, id := range ids {
				in[i].ID = id
			}
			order, err := slot(in)
			if err != nil {
				return nil, err
			}
			out := make([]string, 0, len(ids))
			for _, j := range order {
				if j < uint64(len(ids)) {
					out = append(out, ids[j])
				}
			}
			return out, nil
		}
	}
	return NewDelegatingIndex(e, ext.Destroy)
}
