package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress is a progress bar on one terminal line (github.com/schollz/
// progressbar: count, rate, elapsed time and ETA, sized to the terminal,
// cleared at the end). Disabled, it draws nothing, so logs of
// non-interactive runs stay short.
type progress struct{ bar *progressbar.ProgressBar }

// newProgress returns a bar of total units named unit (for example
// "runs"), drawn on w when on.
func newProgress(w io.Writer, on bool, label, unit string, total int) *progress {
	if !on || total <= 0 {
		return &progress{}
	}
	return &progress{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(label),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(unit),
		progressbar.OptionFullWidth(),
		progressbar.OptionThrottle(50*time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionClearOnFinish(),
	)}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// set moves the bar to done units.
func (p *progress) set(done int) {
	if p.bar != nil {
		_ = p.bar.Set(done) // a failed write to the terminal only loses the bar
	}
}

// finish completes and erases the bar.
func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
