package sim

// CostModel gives the duration of one engine step (EVALUATION.md §3):
//
//	T_prefill = T0 + Beta·Σu + Gamma·Σu·(p + u/2)   (when the step prefills)
//	T_dec     = D0 + D1·B + D2·Σctx                 (when the step decodes)
//	T_step    = T_prefill + T_dec
//
// u is a request's prefill chunk this step (uncached tokens computed), p the
// tokens already in its KV before the chunk (reused prefix and earlier
// chunks), B the number of decoding requests and ctx a decoding request's
// context length. All times are in seconds. A mixed step pays both fixed
// costs: a conservative choice that is the same for every policy.
//
// The defaults are shaped after a dense 8B model with 16-bit KV on an
// H100-class GPU (prefill about 20k tokens/s, attention adding about 3% of
// the linear cost per 1k tokens of context, a 6 ms decode step reading the
// weights, 128 KiB of KV read per context token at about 3 TB/s). They are a
// model, not a measurement; every constant is a flag of `kvcm simulate`.
type CostModel struct {
	T0    float64 `json:"t0"`
	Beta  float64 `json:"beta"`
	Gamma float64 `json:"gamma"`
	D0    float64 `json:"d0"`
	D1    float64 `json:"d1"`
	D2    float64 `json:"d2"`
}

// DefaultCost returns the default constants.
func DefaultCost() CostModel {
	return CostModel{
		T0:    0.002,
		Beta:  5e-5,
		Gamma: 1.6e-9,
		D0:    0.006,
		D1:    2e-5,
		D2:    4e-8,
	}
}

// stepCost accumulates one step.
type stepCost struct {
	sumU, sumUP float64
	b           int
	sumCtx      float64
}

func (s *stepCost) prefill(u, p int) {
	s.sumU += float64(u)
	s.sumUP += float64(u) * (float64(p) + float64(u)/2)
}

func (s *stepCost) decode(ctx int) {
	s.b++
	s.sumCtx += float64(ctx)
}

func (c CostModel) step(s *stepCost) float64 {
	var t float64
	if s.sumU > 0 {
		t += c.T0 + c.Beta*s.sumU + c.Gamma*s.sumUP
	}
	if s.b > 0 {
		t += c.D0 + c.D1*float64(s.b) + c.D2*s.sumCtx
	}
	return t
}
