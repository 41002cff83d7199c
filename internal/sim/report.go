package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func pm(e Estimate, scale float64, prec int) string {
	if e.N > 1 {
		return fmt.Sprintf("%.*f±%.*f", prec, e.Mean*scale, prec, e.CI*scale)
	}
	return fmt.Sprintf("%.*f", prec, e.Mean*scale)
}

// WriteTable writes one table per workload: a row per load and policy with
// the mean over seeds (± the 95% confidence half-width where shown), except
// worst wait and worst bypass, the largest over seeds. Times are in seconds
// unless marked.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "kvcm simulate: %d seeds, token budget %d, max batch %d, %d tokens a block, warm-up %.0f%%, index %s\n",
		len(r.Seeds), r.TokenBudget, r.MaxBatch, r.Block, 100*r.Warmup, r.Index)
	fmt.Fprintf(w, "cost: t0=%g beta=%g gamma=%g d0=%g d1=%g d2=%g (s)\n",
		r.Cost.T0, r.Cost.Beta, r.Cost.Gamma, r.Cost.D0, r.Cost.D1, r.Cost.D2)
	for _, wp := range r.Workloads {
		fmt.Fprintf(w, "\n== %s: %d requests, KV capacity %d tokens%s", wp.Name, wp.Requests, wp.CapacityTokens, wp.footprint())
		fmt.Fprintf(w, ", %s saturation %.3f req/s\n", r.saturationOf(), wp.Saturation)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "load\tpolicy\tbound\tTTFT mean\tp50\tp90\tp99\tqueue mean\tqueue p99\ttransfer mean\tprefill mean\tprefill p99\thit %\tgpu/host/disk %\tonboard GB\toffload GB\tprefill tok/req\tevictions\tworst wait\tworst bypass\tsched µs/step\tmean gain vs FCFS %\tp99 gain %\tother baselines\t")
		for _, pt := range wp.Points {
			a := pt.Agg
			gm, gp := "", ""
			if pt.GainMean != nil {
				gm, gp = pm(*pt.GainMean, 100, 1), pm(*pt.GainP99, 100, 1)
			}
			fmt.Fprintf(tw, "%.2f\t%s\t%s\t%s\t%.3f\t%.3f\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.2f\t%.0f\t%.1f\t%s\t%s\t%s\t\n",
				pt.Load, pt.Policy, pt.Bound, pm(a.TTFTMean, 1, 3), a.TTFTP50.Mean, a.TTFTP90.Mean, pm(a.TTFTP99, 1, 2),
				a.QueueMean.Mean, a.QueueP99.Mean, a.TransferMean.Mean, a.PrefillMean.Mean, a.PrefillP99.Mean,
				pm(a.HitRatio, 100, 1), a.levels(), a.OnboardGB.Mean, a.PrefetchGB.Mean, a.RecomputedGB.Mean, a.OffloadGB.Mean,
				a.PrefillTokens.Mean, a.Evictions.Mean, a.WorstWait, a.WorstBypass,
				a.SchedMicros.Mean, gm, gp, pt.otherGains())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// saturationOf names the variant whose saturation defines the load (FCFS
// for reports from before variants).
func (r *Report) saturationOf() string {
	if r.SaturationOf == "" || r.SaturationOf == "fcfs" {
		return "FCFS"
	}
	return r.SaturationOf
}

// levels is the hit ratio by level, in percent.
func (a Aggregate) levels() string {
	return fmt.Sprintf("%.1f/%.1f/%.1f", 100*a.HitGPU.Mean, 100*a.HitHost.Mean, 100*a.HitDisk.Mean)
}

// otherGains lists the gains against the FCFS baselines after the first:
// "vs BASELINE mean m±ci p99 m±ci", separated by "; ".
func (pt Point) otherGains() string {
	gains := pt.Gains
	if pt.GainMean != nil {
		gains = gains[1:] // the first FCFS variant's, shown on its own
	}
	var out []string
	for _, g := range gains {
		out = append(out, fmt.Sprintf("vs %s %s / %s", g.Against, pm(g.Mean, 100, 1), pm(g.P99, 100, 1)))
	}
	if len(out) == 0 {
		return "—"
	}
	return strings.Join(out, "; ")
}

// footprint describes the capacity against the footprint, if there is one.
func (wp WorkloadPoint) footprint() string {
	if wp.Footprint <= 0 {
		return ""
	}
	what := "footprint"
	if wp.FootprintMeasured {
		what = "footprint measured from the traces (blocks that begin two or more prompts)"
	}
	return fmt.Sprintf(" (%.2f× the %d-token %s)", float64(wp.CapacityTokens)/float64(wp.Footprint), wp.Footprint, what)
}

// WriteMarkdown writes the tables of WriteTable as Markdown, one per
// workload, with the gain against FCFS next to each row.
func (r *Report) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "%d seeds (%v), token budget %d, max batch %d, %d tokens a block, %.0f%% warm-up dropped, index `%s`; "+
		"cost t0=%g β=%g γ=%g d0=%g d1=%g d2=%g s. Means over seeds ± 95%% CI half-width; worst wait and worst bypass are the largest over seeds; "+
		"gains are paired per seed against FCFS on the same trace (positive = lower TTFT).\n",
		len(r.Seeds), r.Seeds, r.TokenBudget, r.MaxBatch, r.Block, 100*r.Warmup, r.Index,
		r.Cost.T0, r.Cost.Beta, r.Cost.Gamma, r.Cost.D0, r.Cost.D1, r.Cost.D2)
	for _, wp := range r.Workloads {
		fmt.Fprintf(w, "\n#### %s\n\n%d requests, KV capacity %d tokens%s", wp.Name, wp.Requests, wp.CapacityTokens, wp.footprint())
		fmt.Fprintf(w, ", %s saturation %.3f req/s.\n\n", r.saturationOf(), wp.Saturation)
		fmt.Fprintln(w, "| ρ | policy | bound | TTFT mean (s) | p50 | p90 | p99 | queue mean | transfer mean | prefill mean | hit % | gpu/host/disk % | onboard GB | prefetch GB | recomputed GB | offload GB | prefill tok/req | evictions | worst wait (s) | worst bypass | sched µs/step | mean gain % | p99 gain % | gains vs other FCFS (mean / p99 %) |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, pt := range wp.Points {
			a := pt.Agg
			gm, gp := "—", "—"
			if pt.GainMean != nil {
				gm, gp = pm(*pt.GainMean, 100, 1), pm(*pt.GainP99, 100, 1)
			}
			fmt.Fprintf(w, "| %.2f | %s | %s | %s | %.3f | %.3f | %s | %.3f | %.3f | %.3f | %s | %s | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f | %.2f | %.0f | %.1f | %s | %s | %s |\n",
				pt.Load, pt.Policy, pt.Bound, pm(a.TTFTMean, 1, 3), a.TTFTP50.Mean, a.TTFTP90.Mean, pm(a.TTFTP99, 1, 2),
				a.QueueMean.Mean, a.TransferMean.Mean, a.PrefillMean.Mean, pm(a.HitRatio, 100, 1), a.levels(),
				a.OnboardGB.Mean, a.PrefetchGB.Mean, a.RecomputedGB.Mean, a.OffloadGB.Mean, a.PrefillTokens.Mean, a.Evictions.Mean,
				a.WorstWait, a.WorstBypass, a.SchedMicros.Mean, gm, gp, pt.otherGains())
		}
	}
	return nil
}

// ReadReports reads JSON reports (as written by WriteJSON) and merges their
// workloads into the first one's settings.
func ReadReports(rs ...io.Reader) (*Report, error) {
	var out *Report
	for _, r := range rs {
		var rep Report
		if err := json.NewDecoder(r).Decode(&rep); err != nil {
			return nil, err
		}
		if out == nil {
			out = &rep
			continue
		}
		out.Workloads = append(out.Workloads, rep.Workloads...)
		out.WallSeconds += rep.WallSeconds
	}
	if out == nil {
		return nil, fmt.Errorf("sim: no report")
	}
	return out, nil
}
