package eval

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"sort"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// WritePNG draws perplexity against bits/element, one labelled point
// per row (rows whose windows cover the context labelled "nothing
// quantised"), as a 640×400 PNG, with
// golang.org/x/image's built-in 7×13 bitmap font. Returns the encoder's or
// the writer's error.
func (r *KVReport) WritePNG(out io.Writer, title string) error {
	const W, H, ml, mr, mt, mb = 640, 400, 70, 30, 40, 50
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
	black := color.RGBA{0, 0, 0, 0xff}
	blue := color.RGBA{0x46, 0x82, 0xb4, 0xff}
	rows := append([]KVRow(nil), r.Rows...)
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].BitsPerElement < rows[j].BitsPerElement })
	xmin, xmax, ymin, ymax := plotRange(rows)
	px := func(x float64) int { return ml + int(math.Round((math.Log2(x)-xmin)/(xmax-xmin)*(W-ml-mr))) }
	py := func(y float64) int { return H - mb - int(math.Round((y-ymin)/(ymax-ymin)*(H-mt-mb))) }
	text := func(x, y int, s string, c color.Color) {
		d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	for x := ml; x <= W-mr; x++ {
		img.Set(x, H-mb, black)
	}
	for y := mt; y <= H-mb; y++ {
		img.Set(ml, y, black)
	}
	for e := xmin; e <= xmax; e++ {
		s := fmt.Sprintf("%g", math.Exp2(e))
		text(px(math.Exp2(e))-len(s)*7/2, H-mb+16, s, black)
	}
	for i := 0; i <= 4; i++ {
		y := ymin + (ymax-ymin)*float64(i)/4
		s := fmt.Sprintf("%.3g", y)
		text(ml-6-len(s)*7, py(y)+4, s, black)
	}
	text(ml, 16, title, black)
	text((ml+W-mr)/2-84, H-10, "bits per element (log scale)", black)
	text(ml+6, mt-4, "perplexity", black)
	for _, row := range rows {
		cx, cy := px(row.BitsPerElement), py(row.Perplexity)
		for dy := -4; dy <= 4; dy++ {
			for dx := -4; dx <= 4; dx++ {
				if dx*dx+dy*dy <= 16 {
					img.Set(cx+dx, cy+dy, blue)
				}
			}
		}
		label := row.KV
		if row.NothingQuantized {
			label += " (nothing quantised)"
		}
		text(cx+6, cy-6, label, black)
	}
	return png.Encode(out, img)
}

// plotRange returns padded axis ranges for rows, shared by the SVG and PNG
// plots: x in log2(bits/element) units, y in perplexity.
func plotRange(rows []KVRow) (xmin, xmax, ymin, ymax float64) {
	xmin, xmax, ymin, ymax = math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, row := range rows {
		xmin, xmax = math.Min(xmin, row.BitsPerElement), math.Max(xmax, row.BitsPerElement)
		ymin, ymax = math.Min(ymin, row.Perplexity), math.Max(ymax, row.Perplexity)
	}
	if len(rows) == 0 {
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	// x is drawn on a log2 scale (bits per element span 2 to 32): the
	// range is in log2 units, padded to whole powers of two.
	xmin, xmax = math.Floor(math.Log2(math.Max(xmin, 1))), math.Ceil(math.Log2(math.Max(xmax, 2)))
	if xmax <= xmin {
		xmax = xmin + 1
	}
	pad := math.Max((ymax-ymin)*0.1, 0.05*math.Max(1, ymax))
	return xmin, xmax, math.Max(0, ymin-pad), ymax + pad
}
