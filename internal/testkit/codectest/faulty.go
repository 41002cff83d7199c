package codectest

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// Op names a transform of a codec.
type Op int

const (
	OpEncode Op = iota
	OpDecode
)

func (o Op) String() string {
	switch o {
	case OpEncode:
		return "encode"
	case OpDecode:
		return "decode"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Call records one Encode or Decode call seen by a Faulty.
type Call struct {
	Op        Op
	LifeCycle layout.LayerGroupID
	Location  codec.PageIndexLocation
	Pairs     int                   // idx.Len()
	HostPairs []codec.PageIndexPair // a copy of the host pairs; nil for device indices
	OK        bool                  // the result returned
	Injected  FaultMode             // the fault injected into this call, if any
}

// FaultMode says how an injected fault shows.
type FaultMode int

const (
	// NoFault: the call is passed through.
	NoFault FaultMode = iota
	// SyncFault: the call returns false without calling the inner codec, so
	// nothing is enqueued.
	SyncFault
	// AsyncFault: the inner codec runs; if it succeeds, a HostFunc returning
	// the fault's error is enqueued after its work, and the call returns true
	// (false, with the inner work already enqueued, only if that HostFunc
	// cannot be enqueued).
	AsyncFault
	// PanicFault: the call panics with an *InjectedPanic without calling the
	// inner codec, as a buggy codec would.
	PanicFault
)

// InjectedPanic is the value a PanicFault panics with, so a test can tell an
// injected panic from a real one.
type InjectedPanic struct{ Op Op }

func (p *InjectedPanic) Error() string { return fmt.Sprintf("codectest: injected %v panic", p.Op) }

// fault is an armed fault of one Op: skip calls pass, then count calls fail
// (count < 0: every later call).
type fault struct {
	mode        FaultMode
	skip, count int
	err         error
}

// Faulty wraps a codec and, on demand, lies in queries, rejects Configure or
// fails Encode/Decode synchronously or asynchronously, or panics in them. It records every call
// (with its pair count, so tests can assert batching and chunking) and
// whether it was closed. Overrides and faults can be changed at any time. It
// is safe for concurrent use.
type Faulty struct {
	inner codec.ColdPageCodec

	mu              sync.Mutex
	rejectConfigure bool
	configures      int
	configuredWith  []layout.PoolGroupDesc
	coldBytes       map[layout.LayerGroupID]int64
	batching        map[layout.LayerGroupID]layout.LayerGroupID
	location        map[layout.LayerGroupID]codec.PageIndexLocation
	faults          [2]fault
	calls           []Call
	closes          int
}

var _ codec.ColdPageCodec = (*Faulty)(nil)

// NewFaulty wraps inner, passing everything through until told otherwise.
func NewFaulty(inner codec.ColdPageCodec) *Faulty {
	return &Faulty{
		inner:     inner,
		coldBytes: map[layout.LayerGroupID]int64{},
		batching:  map[layout.LayerGroupID]layout.LayerGroupID{},
		location:  map[layout.LayerGroupID]codec.PageIndexLocation{},
	}
}

// Inner returns the wrapped codec.
func (f *Faulty) Inner() codec.ColdPageCodec { return f.inner }

// RejectConfigure makes Configure return false (without calling the inner
// codec) while reject is true.
func (f *Faulty) RejectConfigure(reject bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectConfigure = reject
}

// SetColdPageBytes makes QueryColdPageBytes(lg) return n (0 or a negative
// value to fake a failure). Encode and Decode still use the inner codec's
// layout: use it to test validation, or use Batching for consistent sizes.
func (f *Faulty) SetColdPageBytes(lg layout.LayerGroupID, n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.coldBytes[lg] = n
}

// SetBatchingID makes GetBatchingLayerGroupID(lg) return id (negative to fake
// a failure).
func (f *Faulty) SetBatchingID(lg, id layout.LayerGroupID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batching[lg] = id
}

// SetLocation makes QueryPageIndexLocation(lg) return loc (BadLocation, or
// any value, to fake a failure).
func (f *Faulty) SetLocation(lg layout.LayerGroupID, loc codec.PageIndexLocation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.location[lg] = loc
}

// ClearOverrides removes every query override.
func (f *Faulty) ClearOverrides() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.coldBytes)
	clear(f.batching)
	clear(f.location)
}

// FailSync makes op calls fail synchronously (return false, enqueue nothing):
// the next skip calls pass, then count calls fail (count < 0: all). It
// replaces any fault armed for op.
func (f *Faulty) FailSync(op Op, skip, count int) {
	f.arm(op, fault{mode: SyncFault, skip: skip, count: count})
}

// FailAsync makes op calls fail asynchronously: the inner codec's work is
// enqueued, then a HostFunc returning err (device.ErrInjected if nil), and
// the call returns true. The next skip calls pass, then count calls fail
// (count < 0: all). It replaces any fault armed for op.
func (f *Faulty) FailAsync(op Op, skip, count int, err error) {
	if err == nil {
		err = fmt.Errorf("codectest: injected asynchronous %v failure: %w", op, device.ErrInjected)
	}
	f.arm(op, fault{mode: AsyncFault, skip: skip, count: count, err: err})
}

// FailPanic makes op calls panic with an *InjectedPanic (enqueueing
// nothing), as a buggy codec would: the next skip calls pass, then count
// calls panic (count < 0: all). It replaces any fault armed for op.
func (f *Faulty) FailPanic(op Op, skip, count int) {
	f.arm(op, fault{mode: PanicFault, skip: skip, count: count})
}

// Heal disarms the faults of every op.
func (f *Faulty) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = [2]fault{}
}

func (f *Faulty) arm(op Op, ft fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[op] = ft
}

// next consumes one call of op from its armed fault.
func (f *Faulty) next(op Op) (FaultMode, error) {
	ft := &f.faults[op]
	if ft.mode == NoFault {
		return NoFault, nil
	}
	if ft.skip > 0 {
		ft.skip--
		return NoFault, nil
	}
	if ft.count == 0 {
		*ft = fault{}
		return NoFault, nil
	}
	if ft.count > 0 {
		ft.count--
	}
	return ft.mode, ft.err
}

// Configure records the call and forwards it unless rejecting.
func (f *Faulty) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	f.mu.Lock()
	f.configures++
	f.configuredWith = cloneDescs(gpuDescs)
	reject := f.rejectConfigure
	f.mu.Unlock()
	if reject {
		return false
	}
	return f.inner.Configure(gpuDescs)
}

// QueryColdPageBytes returns the override for lg or the inner answer.
func (f *Faulty) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	f.mu.Lock()
	v, ok := f.coldBytes[lg]
	f.mu.Unlock()
	if ok {
		return v
	}
	return f.inner.QueryColdPageBytes(lg)
}

// GetBatchingLayerGroupID returns the override for lg or the inner answer.
func (f *Faulty) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	f.mu.Lock()
	v, ok := f.batching[lg]
	f.mu.Unlock()
	if ok {
		return v
	}
	return f.inner.GetBatchingLayerGroupID(lg)
}

// QueryPageIndexLocation returns the override for lg or the inner answer.
func (f *Faulty) QueryPageIndexLocation(lg layout.LayerGroupID) codec.PageIndexLocation {
	f.mu.Lock()
	v, ok := f.location[lg]
	f.mu.Unlock()
	if ok {
		return v
	}
	return f.inner.QueryPageIndexLocation(lg)
}

// Encode records the call and applies the armed encode fault.
func (f *Faulty) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return f.call(OpEncode, lg, idx, stream, func() bool { return f.inner.Encode(lg, dstBase, idx, stream) })
}

// Decode records the call and applies the armed decode fault.
func (f *Faulty) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx codec.PageIndices, stream device.Stream) bool {
	return f.call(OpDecode, lg, idx, stream, func() bool { return f.inner.Decode(lg, srcBase, idx, stream) })
}

func (f *Faulty) call(op Op, lg layout.LayerGroupID, idx codec.PageIndices, stream device.Stream, inner func() bool) bool {
	f.mu.Lock()
	mode, ferr := f.next(op)
	f.mu.Unlock()
	ok := false
	switch mode {
	case PanicFault:
		f.record(Call{Op: op, LifeCycle: lg, Location: idx.Location(), Pairs: idx.Len(), Injected: mode}, idx)
		panic(&InjectedPanic{Op: op})
	case SyncFault:
	case AsyncFault:
		ok = inner()
		if ok && stream != nil {
			ok = stream.HostFunc(func() error { return ferr }) == nil
		}
	default:
		ok = inner()
	}
	f.record(Call{Op: op, LifeCycle: lg, Location: idx.Location(), Pairs: idx.Len(), OK: ok, Injected: mode}, idx)
	return ok
}

func (f *Faulty) record(c Call, idx codec.PageIndices) {
	if idx.Location() == codec.Host {
		c.HostPairs = slices.Clone(idx.Host())
	}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
}

// Calls returns every Encode and Decode call so far, in order.
func (f *Faulty) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// CallCount is the number of op calls so far.
func (f *Faulty) CallCount(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c.Op == op {
			n++
		}
	}
	return n
}

// PairsPerCall returns the pair count of every op call, in order.
func (f *Faulty) PairsPerCall(op Op) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for _, c := range f.calls {
		if c.Op == op {
			out = append(out, c.Pairs)
		}
	}
	return out
}

// ResetCalls forgets the recorded calls.
func (f *Faulty) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// ConfigureCalls is how many times Configure was called.
func (f *Faulty) ConfigureCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.configures
}

// ConfiguredWith returns a copy of the descriptors of the last Configure call.
func (f *Faulty) ConfiguredWith() []layout.PoolGroupDesc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneDescs(f.configuredWith)
}

// Closes is how many times Close was called: an owner must close exactly once.
func (f *Faulty) Closes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closes
}

// Close counts the call and destroys the inner codec (codec.Destroy) the first
// time.
func (f *Faulty) Close() error {
	f.mu.Lock()
	f.closes++
	first := f.closes == 1
	f.mu.Unlock()
	if !first {
		return nil
	}
	return codec.Destroy(f.inner)
}

func cloneDescs(ds []layout.PoolGroupDesc) []layout.PoolGroupDesc {
	if ds == nil {
		return nil
	}
	out := make([]layout.PoolGroupDesc, len(ds))
	for i, d := range ds {
		out[i] = d
		out[i].LifeCycles = slices.Clone(d.LifeCycles)
		out[i].Pools = slices.Clone(d.Pools)
	}
	return out
}
