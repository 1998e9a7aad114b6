package eval

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/lmpack/lmpack/internal/fsx"
)

// protocolLine is the header line naming the protocol, its prompt and
// chunk, the windows and the contexts of the two bits/element columns.
func (r *KVReport) protocolLine() string {
	proto := cmp.Or(r.Protocol, ProtocolDecode)
	s := fmt.Sprintf("KV cache comparison, protocol %s (prompt %d, chunk %d): %d windows of %d tokens, %d positions scored", proto, r.Prompt, r.Chunk, r.Windows, r.Ctx, r.TokensScored)
	if r.ServingCtx > 0 {
		s += fmt.Sprintf("; bits/element at ctx %d and at serving ctx %d", r.Ctx, r.ServingCtx)
	}
	if r.Protocol != ProtocolFakeQuant {
		s += "; bits_read: bits/element of the cached tokens the scored queries read (as each query reads them after its own write: windows counted back from the query, a block its write completes quantised)"
	}
	return s
}

// nothingQuantised is the note of a row that reads nothing quantised: its
// fp16 windows cover the context, or its method keeps every layer in fp16
// (vLLM's turboquant presets keep the first and last two layers, all of a
// 4-layer model).
const nothingQuantised = "nothing quantised (fp16 windows or fp16 layers cover the context)"

// writeGrid prints cells as columns padded by rune count (so that "ΔPPL"
// and other multi-byte text stay aligned): the first column left-aligned,
// the others right-aligned, and a last column left-aligned when left is
// set. Rows shorter than the header are padded with empty cells.
func writeGrid(w io.Writer, cells [][]string, leftLast bool) {
	var width []int
	for _, row := range cells {
		for i, c := range row {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range cells {
		var b strings.Builder
		for i := range width {
			c := ""
			if i < len(row) {
				c = row[i]
			}
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteByte(' ')
			}
			if i == 0 || (leftLast && i == len(width)-1) {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// WriteTable prints the comparison as a table whose columns are aligned by
// rune count: a header line naming the protocol, prompt and chunk; then
// per method bits/element at the evaluated context (and at the serving
// context when known), bits per element read by the scored queries
// (KVRow.BitsRead; "-" under fake-quant), KV bytes at the window length, perplexity, ΔPPL
// against fp32 KV, KL (nats), top-1 agreement, tokens/s and a note
// ("nothing quantised" for a row whose windows cover the context: its
// numbers are not a result of its quantiser); then the per-position
// buckets (KL and top-1 per method). Returns the first write error.
func (r *KVReport) WriteTable(out io.Writer) error {
	w := &fsx.ErrWriter{W: out}
	fmt.Fprintln(w, r.protocolLine())
	head := []string{"kv", fmt.Sprintf("bits@%d", r.Ctx)}
	if r.ServingCtx > 0 {
		head = append(head, fmt.Sprintf("bits@%d", r.ServingCtx))
	}
	head = append(head, "bits_read", "kv_bytes", "fp16/query", "perplexity", "ΔPPL", "KL", "top-1", "tokens/s", "note")
	cells := [][]string{head}
	for _, row := range r.Rows {
		c := []string{row.KV, fmt.Sprintf("%.3f", row.BitsPerElement)}
		if r.ServingCtx > 0 {
			c = append(c, fmt.Sprintf("%.3f", row.BitsServing))
		}
		note := ""
		if row.NothingQuantized {
			note = nothingQuantised
		}
		fq := "-"
		if row.FP16PerQueryKnown {
			fq = fmt.Sprintf("%.1f", row.FP16PerQuery)
		}
		br := "-"
		if row.BitsRead > 0 {
			br = fmt.Sprintf("%.3f", row.BitsRead)
		}
		c = append(c, br, fmt.Sprintf("%d", row.KVBytes), fq, fmt.Sprintf("%.4f", row.Perplexity), Signed(row.DeltaPPL, 4),
			fmt.Sprintf("%.5f", row.KL), fmt.Sprintf("%.4f", row.Top1Agreement), fmt.Sprintf("%.1f", row.TokensPerSecond), note)
		cells = append(cells, c)
	}
	writeGrid(w, cells, true)
	if len(r.Rows) > 0 && len(r.Rows[0].Buckets) > 0 {
		fmt.Fprintf(w, "\nby query position: KL (nats) / top-1 agreement\n")
		head := []string{"kv"}
		for _, b := range r.Rows[0].Buckets {
			head = append(head, fmt.Sprintf("%d-%d", b.From, b.To-1))
		}
		cells := [][]string{head}
		for _, row := range r.Rows {
			c := []string{row.KV}
			for _, b := range row.Buckets {
				c = append(c, fmt.Sprintf("%.5f / %.4f", b.KL, b.Top1Agreement))
			}
			cells = append(cells, c)
		}
		writeGrid(w, cells, false)
	}
	if r.Layers != nil && w.Err == nil {
		fmt.Fprintln(w)
		return r.Layers.WriteLayerTable(out)
	}
	return w.Err
}

// plotColors and plotShapes give each method (KVRow.Method, in order of
// first appearance) its marker in WriteSVG.
var (
	plotColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
	plotShapes = []string{"circle", "square", "triangle", "diamond"}
)

// svgMarker draws shape at (x, y) of radius 4.5 in color, hollow (white
// fill) when hollow.
func svgMarker(w io.Writer, shape, color string, x, y float64, hollow bool) {
	fill := color
	if hollow {
		fill = "white"
	}
	const r = 4.5
	switch shape {
	case "square":
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%g" height="%g" fill="%s" stroke="%s"/>`+"\n", x-r, y-r, 2*r, 2*r, fill, color)
	case "triangle":
		fmt.Fprintf(w, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s" stroke="%s"/>`+"\n", x, y-r-1, x-r, y+r, x+r, y+r, fill, color)
	case "diamond":
		fmt.Fprintf(w, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s" stroke="%s"/>`+"\n", x, y-r-1, x+r+1, y, x, y+r+1, x-r-1, y, fill, color)
	default:
		fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="%g" fill="%s" stroke="%s"/>`+"\n", x, y, r, fill, color)
	}
}

// WriteSVG draws the Pareto view of the comparison as a standalone SVG
// document (820×760 px): two panels, KL (nats, log scale; KL 0 drawn on
// the bottom edge) and ΔPPL (linear) against bits/element at the
// evaluated context (log scale, stated on the axis), one marker per row,
// one color and shape per method (KVRow.Method) with a legend, labelled
// with the row's name; rows whose windows cover the context are hollow
// and labelled "nothing quantised". Returns the first write error.
func (r *KVReport) WriteSVG(out io.Writer, title string) error {
	w := &fsx.ErrWriter{W: out}
	const W, H, ml, mr, mt, panelH, gap = 820.0, 760.0, 80.0, 190.0, 50.0, 300.0, 80.0
	rows := append([]KVRow(nil), r.Rows...)
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].BitsPerElement < rows[j].BitsPerElement })
	var methods []string
	for _, row := range r.Rows {
		m := cmp.Or(row.Method, row.KV)
		if !slices.Contains(methods, m) {
			methods = append(methods, m)
		}
	}
	marker := func(m string) (string, string) {
		i := slices.Index(methods, m)
		return plotShapes[i%len(plotShapes)], plotColors[i%len(plotColors)]
	}
	xmin, xmax, _, _ := plotRange(rows)
	px := func(x float64) float64 { return ml + (math.Log2(x)-xmin)/(xmax-xmin)*(W-ml-mr) }
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="%g" y="20" font-size="14">%s</text>`+"\n", ml, xmlEscape(title))
	fmt.Fprintf(w, `<text x="%g" y="38">%s</text>`+"\n", ml, xmlEscape(r.protocolLine()))
	// KL on a log10 axis from the smallest positive KL (a decade below
	// when all are equal) to the largest; ΔPPL linear.
	klLo, klHi := math.Inf(1), math.Inf(-1)
	dLo, dHi := 0.0, 0.0
	for _, row := range rows {
		if row.KL > 0 {
			klLo, klHi = math.Min(klLo, row.KL), math.Max(klHi, row.KL)
		}
		dLo, dHi = math.Min(dLo, row.DeltaPPL), math.Max(dHi, row.DeltaPPL)
	}
	if math.IsInf(klLo, 1) {
		klLo, klHi = 1e-4, 1
	}
	klLo, klHi = math.Floor(math.Log10(klLo)), math.Ceil(math.Log10(klHi))
	if klHi <= klLo {
		klHi = klLo + 1
	}
	if pad := (dHi - dLo) * 0.1; pad > 0 {
		dLo, dHi = dLo-pad, dHi+pad
	} else {
		dLo, dHi = -1, 1
	}
	panels := []struct {
		name   string
		y      func(KVRow) float64
		lo, hi float64
		log    bool
	}{
		{"KL (nats, log scale)", func(r KVRow) float64 { return r.KL }, klLo, klHi, true},
		{"ΔPPL", func(r KVRow) float64 { return r.DeltaPPL }, dLo, dHi, false},
	}
	for p, pn := range panels {
		top := mt + float64(p)*(panelH+gap)
		bot := top + panelH
		py := func(y float64) float64 {
			if pn.log {
				if y <= 0 {
					return bot
				}
				y = math.Log10(y)
			}
			return bot - (math.Max(pn.lo, math.Min(pn.hi, y))-pn.lo)/(pn.hi-pn.lo)*panelH
		}
		fmt.Fprintf(w, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n", ml, bot, W-mr, bot)
		fmt.Fprintf(w, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n", ml, top, ml, bot)
		for e := xmin; e <= xmax; e++ {
			fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="middle">%g</text>`+"\n", px(math.Exp2(e)), bot+16, math.Exp2(e))
		}
		if pn.log {
			for e := pn.lo; e <= pn.hi; e++ {
				fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="end">1e%g</text>`+"\n", ml-6, py(math.Pow(10, e))+4, e)
			}
		} else {
			for i := 0; i <= 4; i++ {
				y := pn.lo + (pn.hi-pn.lo)*float64(i)/4
				fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="end">%.3g</text>`+"\n", ml-6, py(y)+4, y)
			}
			fmt.Fprintf(w, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#bbb" stroke-dasharray="4 3"/>`+"\n", ml, py(0), W-mr, py(0))
		}
		fmt.Fprintf(w, `<text x="%g" y="%g" text-anchor="middle">bits per element at the evaluated ctx %d (log scale)</text>`+"\n", (ml+W-mr)/2, bot+34, r.Ctx)
		fmt.Fprintf(w, `<text x="18" y="%g" transform="rotate(-90 18 %g)" text-anchor="middle">%s</text>`+"\n", (top+bot)/2, (top+bot)/2, xmlEscape(pn.name))
		for _, row := range rows {
			shape, color := marker(cmp.Or(row.Method, row.KV))
			x, y := px(math.Max(row.BitsPerElement, 1e-9)), py(pn.y(row))
			svgMarker(w, shape, color, x, y, row.NothingQuantized)
			label := row.KV
			if row.NothingQuantized {
				label += " (nothing quantised)"
			}
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f" font-size="10">%s</text>`+"\n", x+7, y-5, xmlEscape(label))
		}
	}
	fmt.Fprintf(w, `<text x="%g" y="%g">method</text>`+"\n", W-mr+20, mt+10)
	for i, m := range methods {
		shape, color := marker(m)
		y := mt + 30 + float64(i)*18
		svgMarker(w, shape, color, W-mr+26, y, false)
		fmt.Fprintf(w, `<text x="%g" y="%g">%s</text>`+"\n", W-mr+38, y+4, xmlEscape(m))
	}
	fmt.Fprintln(w, "</svg>")
	return w.Err
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// Signed formats v with an explicit sign and prec decimals, writing a
// value that rounds to zero as +0 ("+0.0000", never "-0.0000").
func Signed(v float64, prec int) string {
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if strings.Trim(s, "-0.") == "" {
		return "+" + strings.TrimPrefix(s, "-")
	}
	if v >= 0 {
		return "+" + s
	}
	return s
}
