package hub

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/schollz/progressbar/v3"
)

// logInterval is the minimum time between two progress log lines of one
// file when the progress writer is not a terminal.
var logInterval = 15 * time.Second

// fileProgress receives the bytes of one file as they arrive.
type fileProgress interface {
	io.Writer
	// end closes the display; err is the download's outcome.
	end(err error)
}

// startProgress opens the display for one file of total bytes (-1 when
// unknown) of which done are already on disk: a progress bar on a
// terminal, else log lines.
func (r *resolver) startProgress(name string, total, done int64) fileProgress {
	if r.opt.Terminal && r.opt.Progress != nil {
		return newBarProgress(r.opt.Progress, name, total, done)
	}
	lp := &logProgress{log: r.log, model: r.ref(), name: name, total: total, done: done, start: time.Now(), resumed: done}
	lp.last = lp.start
	r.log.Info("hub: downloading", "model", r.ref(), "file", name, "bytes", total, "resume_from", done)
	return lp
}

type barProgress struct {
	w   io.Writer
	bar *progressbar.ProgressBar
}

func newBarProgress(w io.Writer, name string, total, done int64) *barProgress {
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(name),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprint(w, "\n") }),
	)
	if done > 0 {
		_ = bar.Add64(done)
	}
	return &barProgress{w: w, bar: bar}
}

func (b *barProgress) Write(p []byte) (int, error) {
	_ = b.bar.Add64(int64(len(p)))
	return len(p), nil
}

func (b *barProgress) end(err error) {
	if err == nil {
		_ = b.bar.Finish()
		if !b.bar.IsFinished() {
			_ = b.bar.Exit()
		}
		return
	}
	_ = b.bar.Exit()
}

// logProgress writes an slog line at most every logInterval.
type logProgress struct {
	log                  *slog.Logger
	model, name          string
	total, done, resumed int64
	start, last          time.Time
}

func (l *logProgress) Write(p []byte) (int, error) {
	l.done += int64(len(p))
	if now := time.Now(); now.Sub(l.last) >= logInterval {
		l.last = now
		attrs := []any{"model", l.model, "file", l.name, "bytes", l.done, "of", l.total,
			"MB_per_s", fmt.Sprintf("%.1f", float64(l.done-l.resumed)/since(l.start)/1e6)}
		if l.total > 0 {
			attrs = append(attrs, "percent", fmt.Sprintf("%.1f", 100*float64(l.done)/float64(l.total)))
		}
		l.log.Info("hub: download progress", attrs...)
	}
	return len(p), nil
}

func (l *logProgress) end(err error) {
	if err != nil {
		return
	}
	l.log.Info("hub: downloaded", "model", l.model, "file", l.name, "bytes", l.done,
		"seconds", fmt.Sprintf("%.1f", since(l.start)),
		"MB_per_s", fmt.Sprintf("%.1f", float64(l.done-l.resumed)/since(l.start)/1e6))
}
