package gpucodec

import "math"

// Format is the element type of a quantized hot page.
type Format int

const (
	// Float16 is IEEE 754 binary16, little-endian.
	Float16 Format = iota
	// BFloat16 is bfloat16 (the upper half of a float32), little-endian.
	BFloat16
)

func (f Format) String() string {
	switch f {
	case Float16:
		return "fp16"
	case BFloat16:
		return "bf16"
	}
	return "Format(?)"
}

// ToFloat32 decodes one element of format f.
func (f Format) ToFloat32(bits uint16) float32 {
	if f == BFloat16 {
		return math.Float32frombits(uint32(bits) << 16)
	}
	return halfToFloat32(bits)
}

// FromFloat32 encodes x in format f, rounding to nearest even.
func (f Format) FromFloat32(x float32) uint16 {
	if f == BFloat16 {
		b := math.Float32bits(x)
		if x != x { // NaN stays a quiet NaN
			return uint16(b>>16) | 0x40
		}
		return uint16((b + 0x7fff + (b>>16)&1) >> 16)
	}
	return float32ToHalf(x)
}

// unitRoundoff is half the spacing of the format's mantissa.
func (f Format) unitRoundoff() float64 {
	if f == BFloat16 {
		return 1.0 / 256
	}
	return 1.0 / 2048
}

func halfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: man * 2^-24.
	v := float32(man) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

func float32ToHalf(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := man >> shift
		rem := man & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, up to infinity: correct
	}
	return sign | uint16(r)
}

// E4M3Max is the largest finite FP8 e4m3 value; a block's scale is its
// largest magnitude divided by it.
const E4M3Max = 448

// ErrorBound is the largest |decoded - x| Quant allows for an element x of a
// block whose largest magnitude is amax, in format f: e4m3 keeps 3 mantissa
// bits (relative rounding error 2^-4, or an absolute 2^-10 of the scale for
// values in e4m3's subnormal range), and decoding rounds once more to f.
func ErrorBound(f Format, x, amax float64) float64 {
	ax := math.Abs(x)
	s := amax / E4M3Max
	q := ax/16 + s/1024                                   // e4m3 rounding of x/s, scaled back by s
	y := ax + q                                           // bound on the value rounded to f
	return q + f.unitRoundoff()*y + 1e-6*ax + 1.0/(1<<24) // fp32 steps and fp16's subnormal half-step
}
