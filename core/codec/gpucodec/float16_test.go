package gpucodec

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestHalfConversionsRoundTripEveryValue(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		x := Float16.ToFloat32(uint16(h))
		if x != x {
			continue
		}
		assert.Equal(t, uint16(h), Float16.FromFloat32(x), "%#04x", h)
	}
	for h := 0; h < 1<<16; h++ {
		x := BFloat16.ToFloat32(uint16(h))
		if x != x {
			continue
		}
		assert.Equal(t, uint16(h), BFloat16.FromFloat32(x), "bf16 %#04x", h)
	}
}

func TestHalfRoundsToNearestEven(t *testing.T) {
	assert.Equal(t, uint16(0x3c00), Float16.FromFloat32(1+1.0/2048)) // tie to even (down)
	assert.Equal(t, uint16(0x3c02), Float16.FromFloat32(1+3.0/2048)) // tie to even (up)
	assert.Equal(t, uint16(0x3c01), Float16.FromFloat32(1+1.5/2048)) // above the tie
	assert.Equal(t, uint16(0x7c00), Float16.FromFloat32(70000))      // overflow
	assert.Equal(t, uint16(0x0001), Float16.FromFloat32(float32(math.Ldexp(1, -24))))
	assert.Equal(t, uint16(0x0000), Float16.FromFloat32(float32(math.Ldexp(1, -26))))
	assert.Equal(t, uint16(0x3f80), BFloat16.FromFloat32(1))
	assert.Equal(t, uint16(0x3f80), BFloat16.FromFloat32(1+1.0/256)) // tie to even
}

func TestErrorBoundShape(t *testing.T) {
	// Relative 1/16 plus a little, for values near the block maximum.
	b := ErrorBound(Float16, 448, 448)
	assert.InDelta(t, 448.0/16, b, 1)
	assert.Less(t, ErrorBound(Float16, 0, 448), 0.002)
	assert.Greater(t, ErrorBound(BFloat16, 1, 1), ErrorBound(Float16, 1, 1))
}
