package codec

import (
	"fmt"
	"io"
	"sync"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// PanicError is a panic of a codec method that a Guarded recovered.
type PanicError struct {
	Method string // "Configure", "Encode", "Close", ...
	Value  any    // what the codec panicked with
}

func (e *PanicError) Error() string { return fmt.Sprintf("codec: %s panicked: %v", e.Method, e.Value) }

// Guarded wraps a codec so that a panic in any of its methods is that
// method's failure: the call returns the method's failure value (false, 0
// bytes, a negative batching ID, BadLocation; Close an error) as if the codec
// had returned it, and the panic is kept for TakePanic, so the caller can say
// why the call failed. The manager guards every codec it owns: a panicking
// codec is a failing codec and never unwinds through the manager's
// bookkeeping.
//
// A Guarded is safe for concurrent use as far as its codec is; TakePanic
// reports the first panic since the previous TakePanic.
type Guarded struct {
	inner ColdPageCodec

	mu       sync.Mutex
	panicked *PanicError
}

var _ ColdPageCodec = (*Guarded)(nil)

// Guard wraps c; a codec that is already guarded is returned as is. Guard of
// nil is nil.
func Guard(c ColdPageCodec) *Guarded {
	switch g := c.(type) {
	case nil:
		return nil
	case *Guarded:
		return g
	}
	return &Guarded{inner: c}
}

// Inner returns the guarded codec.
func (g *Guarded) Inner() ColdPageCodec { return g.inner }

// TakePanic returns the first panic recovered since the previous TakePanic,
// or nil, and forgets it.
func (g *Guarded) TakePanic() *PanicError {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.panicked
	g.panicked = nil
	return p
}

func (g *Guarded) record(method string, r any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.panicked == nil {
		g.panicked = &PanicError{Method: method, Value: r}
	}
}

// guarded runs call, returning fail when it panics.
func guarded[T any](g *Guarded, method string, fail T, call func() T) (out T) {
	defer func() {
		if r := recover(); r != nil {
			g.record(method, r)
			out = fail
		}
	}()
	return call()
}

// Configure forwards to the codec; a panic is false.
func (g *Guarded) Configure(gpuDescs []layout.PoolGroupDesc) bool {
	return guarded(g, "Configure", false, func() bool { return g.inner.Configure(gpuDescs) })
}

// QueryColdPageBytes forwards to the codec; a panic is 0.
func (g *Guarded) QueryColdPageBytes(lg layout.LayerGroupID) int64 {
	return guarded(g, "QueryColdPageBytes", int64(0), func() int64 { return g.inner.QueryColdPageBytes(lg) })
}

// nativeColdPageBytes forwards to a codec that is a NativeSizer (ok false
// otherwise); a panic is 0.
func (g *Guarded) nativeColdPageBytes(lg layout.LayerGroupID) (n uint64, ok bool) {
	ns, ok := g.inner.(NativeSizer)
	if !ok {
		return 0, false
	}
	return guarded(g, "QueryColdPageBytes", uint64(0), func() uint64 { return ns.NativeColdPageBytes(lg) }), true
}

// GetBatchingLayerGroupID forwards to the codec; a panic is -1.
func (g *Guarded) GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID {
	return guarded(g, "GetBatchingLayerGroupID", layout.LayerGroupID(-1), func() layout.LayerGroupID {
		return g.inner.GetBatchingLayerGroupID(lg)
	})
}

// QueryPageIndexLocation forwards to the codec; a panic is BadLocation.
func (g *Guarded) QueryPageIndexLocation(lg layout.LayerGroupID) PageIndexLocation {
	return guarded(g, "QueryPageIndexLocation", BadLocation, func() PageIndexLocation {
		return g.inner.QueryPageIndexLocation(lg)
	})
}

// Encode forwards to the codec; a panic is false.
func (g *Guarded) Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx PageIndices, stream device.Stream) bool {
	return guarded(g, "Encode", false, func() bool { return g.inner.Encode(lg, dstBase, idx, stream) })
}

// Decode forwards to the codec; a panic is false.
func (g *Guarded) Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx PageIndices, stream device.Stream) bool {
	return guarded(g, "Decode", false, func() bool { return g.inner.Decode(lg, srcBase, idx, stream) })
}

// Close destroys the codec (Destroy); a panic is returned as a *PanicError.
func (g *Guarded) Close() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Method: "Close", Value: r}
		}
	}()
	if cl, ok := g.inner.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}
