//go:build cgo

package gpucodec

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

// quantPage fills a page of format f: blocks of blockElems values, each
// block with its own magnitude (2^-12 .. 2^8), some blocks all zero, and a
// sprinkle of exact zeros and tiny values.
func quantPage(f Format, n, blockElems int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 3))
	b := make([]byte, 2*n)
	var mag float64
	zero := false
	for i := range n {
		if i%blockElems == 0 {
			mag = math.Ldexp(1, r.IntN(21)-12)
			zero = r.IntN(16) == 0
		}
		x := r.NormFloat64() * mag
		switch {
		case zero || r.IntN(50) == 0:
			x = 0
		case r.IntN(50) == 0:
			x *= 1e-4
		}
		binary.LittleEndian.PutUint16(b[2*i:], f.FromFloat32(float32(x)))
	}
	return b
}

// checkQuant compares a decoded page with the original, element by element,
// against ErrorBound, and returns the largest error relative to its block's
// largest magnitude and the RMS of that ratio.
func checkQuant(t *testing.T, f Format, blockElems int, orig, got []byte) (maxRel, rms float64) {
	t.Helper()
	n := len(orig) / 2
	var sum float64
	for b0 := 0; b0 < n; b0 += blockElems {
		var amax float64
		for i := b0; i < b0+blockElems; i++ {
			amax = max(amax, math.Abs(float64(f.ToFloat32(binary.LittleEndian.Uint16(orig[2*i:])))))
		}
		for i := b0; i < b0+blockElems; i++ {
			x := float64(f.ToFloat32(binary.LittleEndian.Uint16(orig[2*i:])))
			y := float64(f.ToFloat32(binary.LittleEndian.Uint16(got[2*i:])))
			e := math.Abs(y - x)
			require.LessOrEqual(t, e, ErrorBound(f, x, amax), "element %d: %g decoded as %g (block max %g)", i, x, y, amax)
			if amax > 0 {
				maxRel = max(maxRel, e/amax)
				sum += (e / amax) * (e / amax)
			} else {
				require.Zero(t, y, "a zero block decodes to zeros")
			}
		}
	}
	return maxRel, math.Sqrt(sum / float64(n))
}

func TestQuantErrorIsBounded(t *testing.T) {
	d := gpu(t)
	for _, f := range []Format{Float16, BFloat16} {
		for _, be := range []int{128, 32, 256} {
			spec := codectest.GroupSpec{NumSlots: 24, LifeCycles: []layout.LayerGroupID{0}, SlotBytes: []int64{8192, 2 * int64(be), 4096}}
			r := rig(t, d, device.DeviceMemory, spec)
			q, err := NewQuant(d, QuantOptions{Format: f, BlockElems: be})
			require.NoError(t, err)
			require.True(t, q.Configure(r.Groups))
			page := r.Group(0).PageBytes()
			blocks := page / int64(2*be)
			cs := q.QueryColdPageBytes(0)
			require.Equal(t, (page/2+4*blocks+15)/16*16, cs)
			orig := make([][]byte, 24)
			for s := range 24 {
				orig[s] = quantPage(f, int(page/2), be, uint64(s))
				require.NoError(t, r.WritePage(0, int64(s), orig[s]))
			}
			cold, err := r.Alloc(device.HostMapped, 24*cs)
			require.NoError(t, err)
			var enc, dec []codec.PageIndexPair
			for s := range 24 {
				enc = append(enc, codec.PageIndexPair{Dst: int32(23 - s), Src: int32(s)})
				dec = append(dec, codec.PageIndexPair{Dst: int32(s), Src: int32(23 - s)})
			}
			require.True(t, q.Encode(0, cold.Ptr(), deviceIndices(t, r, r.Stream, enc), r.Stream))
			require.NoError(t, r.Stream.Synchronize())
			for s := range 24 {
				poison := make([]byte, page)
				for i := range poison {
					poison[i] = 0xff // NaN in both formats: an unwritten element fails the bound
				}
				require.NoError(t, r.WritePage(0, int64(s), poison))
			}
			require.True(t, q.Decode(0, cold.Ptr(), deviceIndices(t, r, r.Stream, dec), r.Stream))
			require.NoError(t, r.Stream.Synchronize())
			var worst, rmsSum float64
			for s := range 24 {
				got, err := r.ReadPage(0, int64(s))
				require.NoError(t, err)
				m, rms := checkQuant(t, f, be, orig[s], got)
				worst = max(worst, m)
				rmsSum += rms * rms
			}
			t.Logf("%v, %d-element blocks: cold/hot %.4f, error/block max: max %.4f (bound 1/16 + rounding), rms %.4f",
				f, be, float64(cs)/float64(page), worst, math.Sqrt(rmsSum/24))
			assert.Less(t, worst, 1.0/16+1.0/128)
			require.NoError(t, q.Close())
		}
	}
}

func TestQuantRejectsLayoutsItCannotEncode(t *testing.T) {
	d := gpu(t)
	r := rig(t, d, device.DeviceMemory, codectest.GroupSpec{NumSlots: 4, LifeCycles: []layout.LayerGroupID{0}, SlotBytes: []int64{300}})
	q, err := NewQuant(d, QuantOptions{})
	require.NoError(t, err)
	defer q.Close()
	assert.False(t, q.Configure(r.Groups), "300 bytes is not a whole number of 128-element blocks")
	_, err = NewQuant(d, QuantOptions{BlockElems: 48})
	assert.Error(t, err)
	_, err = NewQuant(d, QuantOptions{Format: 7})
	assert.Error(t, err)
}

func TestQuantBadIndexFailsTheStream(t *testing.T) {
	d := gpu(t)
	r := rig(t, d, device.DeviceMemory, codectest.GroupSpec{NumSlots: 4, LifeCycles: []layout.LayerGroupID{0}, SlotBytes: []int64{1024}})
	q, err := NewQuant(d, QuantOptions{})
	require.NoError(t, err)
	defer q.Close()
	require.True(t, q.Configure(r.Groups))
	cold, err := r.Alloc(device.HostMapped, 8*q.QueryColdPageBytes(0))
	require.NoError(t, err)
	require.NoError(t, r.Stream.Synchronize())
	idx := deviceIndices(t, r, r.Stream, []codec.PageIndexPair{{Dst: 0, Src: 4}})
	require.True(t, q.Encode(0, cold.Ptr(), idx, r.Stream))
	require.ErrorIs(t, r.Stream.Synchronize(), codec.ErrBadIndex)
	idx = deviceIndices(t, r, r.Stream, []codec.PageIndexPair{{Dst: 5, Src: -1}})
	require.True(t, q.Decode(0, cold.Ptr(), idx, r.Stream))
	require.ErrorIs(t, r.Stream.Synchronize(), codec.ErrBadIndex)
	assert.False(t, q.Encode(0, cold.Ptr()+8, idx, r.Stream), "cold base not 16-byte aligned")
}
