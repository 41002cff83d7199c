package sim

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/sched"
)

// `kvcm simulate --trace` promises "loads relative to its own FCFS
// saturation", but Matrix.Run scales every trace with TimeScaled(1/(ρ·μ)),
// which yields rate ρ·μ only for a trace whose native arrival rate is 1/s
// (the generated workloads). A replayed trace with any other native rate λ0
// runs at λ0·ρ·μ. Here λ0 = 100/s and ρ = 0.1: the intended arrival rate is
// a tenth of saturation, the simulated one is ten times saturation, so the
// server is swamped and throughput sits at μ instead of about 0.1·μ.
func TestRegressionReplayedTraceLoadIsRelativeToItsSaturation(t *testing.T) {
	tr := &Trace{Name: "fast"}
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("r%03d", i)
		tr.Requests = append(tr.Requests, Request{
			ID: id, Arrival: float64(i) * 0.01, Output: 8,
			Segments: []Segment{{Name: id, Len: 256}},
		})
	}
	w := FromTrace(tr)
	w.CapacityTokens = 1 << 16
	base := DefaultOptions()
	base.TokenBudget, base.MaxBatch = 1024, 16
	rep, err := Matrix{
		Workloads: []Workload{w}, Policies: []sched.Policy{sched.FCFS()},
		Loads: []float64{0.1}, Seeds: []uint64{1}, Base: base, Workers: 1,
	}.Run()
	require.NoError(t, err)
	wp := rep.Workloads[0]
	got := wp.Points[0].Agg.Throughput.Mean
	t.Logf("saturation %.2f req/s, throughput at ρ=0.1: %.2f req/s", wp.Saturation, got)
	assert.Less(t, got, 0.3*wp.Saturation, "at ρ=0.1 the server must not run at saturation")
}
