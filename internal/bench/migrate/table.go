package migrate

import (
	"fmt"
	"io"
	"strings"
)

// TableRow is what WriteTable prints for one result; Result fills it.
type TableRow struct {
	Codec, Chunk               string
	Pools, Pages               int
	Enc, Dec, LimD2H, LimH2D   float64
	EncRatio, DecRatio         float64
	EncSubmit, DecSubmit, Unit string
	RawEnc, RawDec             float64 // 0 when not measured
	VsRawEnc, VsRawDec         float64
	ColdOverHot                float64
	Verified                   bool
	MaxRelErr, RMSRelErr       float64
}

// WriteTable prints rows as a Markdown table, then one line per lossy codec
// with its error statistics.
func WriteTable(w io.Writer, rows []TableRow) {
	fmt.Fprintln(w, "| codec | chunk × pools | pages | encode GB/s | decode GB/s | limit D2H / H2D GB/s | encode / limit | decode / limit | submit enc / dec | raw batch enc / dec GB/s | codec / raw (enc, dec) | cold / hot | verified |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		raw, vs := "–", "–"
		if r.RawEnc > 0 {
			raw = fmt.Sprintf("%.2f / %.2f", r.RawEnc, r.RawDec)
			vs = fmt.Sprintf("%.3f, %.3f", r.VsRawEnc, r.VsRawDec)
		}
		ver := "no"
		if r.Verified {
			ver = "every byte"
			if r.MaxRelErr > 0 {
				ver = "error bound"
			}
		}
		fmt.Fprintf(w, "| %s | %s × %d | %d | %.2f | %.2f | %.1f / %.1f | %.3f | %.3f | %s / %s %s | %s | %s | %.3f | %s |\n",
			r.Codec, r.Chunk, r.Pools, r.Pages, r.Enc, r.Dec, r.LimD2H, r.LimH2D, r.EncRatio, r.DecRatio,
			r.EncSubmit, r.DecSubmit, r.Unit, raw, vs, r.ColdOverHot, ver)
	}
	var lossy []string
	for _, r := range rows {
		if r.MaxRelErr > 0 {
			lossy = append(lossy, fmt.Sprintf("%s %s: max |err|/block max %.4f, rms %.4f", r.Codec, r.Chunk, r.MaxRelErr, r.RMSRelErr))
		}
	}
	if len(lossy) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Quantization error against the fp16 original: "+strings.Join(lossy, "; ")+".")
	}
}

func submitString(ns float64) string {
	switch {
	case ns >= 1000:
		return fmt.Sprintf("%.2f µs", ns/1000)
	default:
		return fmt.Sprintf("%.0f ns", ns)
	}
}

// Row converts a result for WriteTable.
func (r Result) Row() TableRow {
	row := TableRow{
		Codec: r.Codec, Chunk: size(r.Chunk), Pools: r.Pools, Pages: r.Pages,
		Enc: r.EncGBs, Dec: r.DecGBs, LimD2H: r.LimitD2H, LimH2D: r.LimitH2D,
		EncRatio: r.EncRatio(), DecRatio: r.DecRatio(),
		Unit:   "per " + r.UnitName,
		RawEnc: r.RawEncGBs, RawDec: r.RawDecGBs,
		Verified: r.Verified, MaxRelErr: r.MaxRelErr, RMSRelErr: r.RMSRelErr,
	}
	if r.Units > 0 {
		row.EncSubmit = submitString(float64(r.EncSubmit.Nanoseconds()) / float64(r.Units))
		row.DecSubmit = submitString(float64(r.DecSubmit.Nanoseconds()) / float64(r.Units))
	}
	if r.RawEncGBs > 0 {
		row.VsRawEnc, row.VsRawDec = r.EncGBs/r.RawEncGBs, r.DecGBs/r.RawDecGBs
	}
	if r.PageBytes > 0 {
		row.ColdOverHot = float64(r.ColdPageBytes) / float64(r.PageBytes)
	}
	return row
}
