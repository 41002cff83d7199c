package codec_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// panicking is a codec every method of which panics.
type panicking struct{}

func (panicking) Configure([]layout.PoolGroupDesc) bool                           { panic("configure") }
func (panicking) QueryColdPageBytes(layout.LayerGroupID) int64                    { panic("bytes") }
func (panicking) GetBatchingLayerGroupID(layout.LayerGroupID) layout.LayerGroupID { panic("batching") }
func (panicking) QueryPageIndexLocation(layout.LayerGroupID) codec.PageIndexLocation {
	panic("location")
}
func (panicking) Encode(layout.LayerGroupID, device.Ptr, codec.PageIndices, device.Stream) bool {
	panic("encode")
}
func (panicking) Decode(layout.LayerGroupID, device.Ptr, codec.PageIndices, device.Stream) bool {
	panic("decode")
}
func (panicking) Close() error { panic("close") }

// A panic in any method of a guarded codec is that method's failure value,
// and TakePanic says which method panicked with what.
func TestGuardedPanicIsTheMethodsFailure(t *testing.T) {
	g := codec.Guard(panicking{})
	for _, tc := range []struct {
		method string
		call   func() any
		fail   any
	}{
		{"Configure", func() any { return g.Configure(nil) }, false},
		{"QueryColdPageBytes", func() any { return g.QueryColdPageBytes(0) }, int64(0)},
		{"GetBatchingLayerGroupID", func() any { return g.GetBatchingLayerGroupID(0) }, layout.LayerGroupID(-1)},
		{"QueryPageIndexLocation", func() any { return g.QueryPageIndexLocation(0) }, codec.BadLocation},
		{"Encode", func() any { return g.Encode(0, 0, codec.HostIndices(nil), nil) }, false},
		{"Decode", func() any { return g.Decode(0, 0, codec.HostIndices(nil), nil) }, false},
	} {
		var got any
		require.NotPanics(t, func() { got = tc.call() }, tc.method)
		assert.Equal(t, tc.fail, got, tc.method)
		p := g.TakePanic()
		require.NotNil(t, p, tc.method)
		assert.Equal(t, tc.method, p.Method)
		assert.Nil(t, g.TakePanic(), "taken once")
	}
	err := g.Close()
	var pe *codec.PanicError
	require.True(t, errors.As(err, &pe), "Close reports its panic: %v", err)
	assert.Equal(t, "close", pe.Value)
}

// A guarded codec that does not panic is the codec itself: results pass
// through, Close destroys it once, and guarding twice adds nothing.
func TestGuardedPassesThrough(t *testing.T) {
	f := codectest.NewFaulty(codec.NewDefault())
	g := codec.Guard(f)
	assert.Same(t, g, codec.Guard(g))
	assert.Nil(t, codec.Guard(nil))
	f.FailSync(codectest.OpEncode, 0, 1)
	assert.False(t, g.Encode(0, 0, codec.HostIndices(nil), nil))
	assert.Nil(t, g.TakePanic(), "returning false is no panic")
	f.FailPanic(codectest.OpDecode, 0, 1)
	assert.False(t, g.Decode(0, 0, codec.HostIndices(nil), nil))
	assert.Equal(t, "Decode", g.TakePanic().Method)
	require.NoError(t, codec.Destroy(g))
	assert.Equal(t, 1, f.Closes())
}
