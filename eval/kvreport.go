package eval

import (
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io"
	"math"
	"sort"
	"strings"
)

// WriteTable prints the comparison as a fixed-width table: method,
// bits/element, KV bytes at the window length, perplexity, ΔPPL against
// fp32 KV, KL (nats), top-1 agreement, tokens/s; then the per-position
// buckets (KL and top-1 per method). Returns the first write error.
func (r *KVReport) WriteTable(out io.Writer) error {
	w := &fsx.ErrWriter{W: out}
	fmt.Fprintf(w, "KV cache comparison: %d windows of %d tokens, %d positions scored\n", r.Windows, r.Ctx, r.TokensScored)
	fmt.Fprintf(w, "%-14s %9s %12s %11s %10s %10s %8s %10s\n", "kv", "bits/elem", "kv_bytes", "perplexity", "ΔPPL", "KL", "top-1", "tokens/s")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "%-14s %9.3f %12d %11.4f %+10.4f %10.5f %8.4f %10.1f\n",
			row.KV, row.BitsPerElement, row.KVBytes, row.Perplexity, row.DeltaPPL, row.KL, row.Top1Agreement, row.TokensPerSecond)
	}
	if len(r.Rows) > 0 && len(r.Rows[0].Buckets) > 0 {
		fmt.Fprintf(w, "\nby query position: KL (nats) / top-1 agreement\n%-14s", "kv")
		for _, b := range r.Rows[0].Buckets {
			fmt.Fprintf(w, " %19s", fmt.Sprintf("%d-%d", b.From, b.To-1))
		}
		fmt.Fprintln(w)
		for _, row := range r.Rows {
			fmt.Fprintf(w, "%-14s", row.KV)
			for _, b := range row.Buckets {
				fmt.Fprintf(w, " %19s", fmt.Sprintf("%.5f / %.4f", b.KL, b.Top1Agreement))
			}
			fmt.Fprintln(w)
		}
	}
	if r.Layers != nil && w.Err == nil {
		fmt.Fprintln(w)
		return r.Layers.WriteLayerTable(out)
	}
	return w.Err
}

// WriteSVG draws perplexity against bits/element, one labelled point per
// row, as a standalone SVG document (640×400 px). Returns the first write
// error.
func (r *KVReport) WriteSVG(out io.Writer, title string) error {
	w := &fsx.ErrWriter{W: out}
	const W, H, ml, mr, mt, mb = 640.0, 400.0, 70.0, 30.0, 40.0, 50.0
	rows := append([]KVRow(nil), r.Rows...)
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].BitsPerElement < rows[j].BitsPerElement })
	xmin, xmax, ymin, ymax := plotRange(rows)
	px := func(x float64) float64 { return ml + (math.Log2(x)-xmin)/(xmax-xmin)*(W-ml-mr) }
	py := func(y float64) float64 { return H - mb - (y-ymin)/(ymax-ymin)*(H-mt-mb) }
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="%g" y="22" font-size="14">%s</text>`+"\n", ml, xmlEscape(title))
	fmt.Fprintf(w, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n", ml, H-mb, W-mr, H-mb)
	fmt.Fprintf(w, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n", ml, mt, ml, H-mb)
	for e := xmin; e <= xmax; e++ {
		fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="middle">%g</text>`+"\n", px(math.Exp2(e)), H-mb+16, math.Exp2(e))
	}
	for i := 0; i <= 4; i++ {
		y := ymin + (ymax-ymin)*float64(i)/4
		fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="end">%.3g</text>`+"\n", ml-6, py(y)+4, y)
	}
	fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="middle">bits per element (log scale)</text>`+"\n", (ml+W-mr)/2, H-10)
	fmt.Fprintf(w, `<text x="16" y="%g" transform="rotate(-90 16 %g)" text-anchor="middle">perplexity</text>`+"\n", (mt+H-mb)/2, (mt+H-mb)/2)
	for _, row := range rows {
		fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="4" fill="steelblue"/>`+"\n", px(row.BitsPerElement), py(row.Perplexity))
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f">%s</text>`+"\n", px(row.BitsPerElement)+6, py(row.Perplexity)-6, xmlEscape(row.KV))
	}
	fmt.Fprintln(w, "</svg>")
	return w.Err
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
