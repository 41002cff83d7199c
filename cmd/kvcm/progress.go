package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress is a one-line progress bar redrawn in place with a carriage
// return. It draws nothing when disabled, so logs of non-interactive runs stay
// short.
type progress struct {
	w       io.Writer
	on      bool
	label   string
	total   int
	start   time.Time
	last    time.Time
	lastLen int
}

const progressWidth = 30

func newProgress(w io.Writer, on bool, label string, total int) *progress {
	now := time.Now()
	return &progress{w: w, on: on && total > 0, label: label, total: total, start: now}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// set draws the bar at done of total, at most every 50 ms and always at the
// end.
func (p *progress) set(done int) {
	if !p.on {
		return
	}
	now := time.Now()
	if done < p.total && now.Sub(p.last) < 50*time.Millisecond {
		return
	}
	p.last = now
	fill := progressWidth * done / p.total
	bar := strings.Repeat("=", fill)
	if fill < progressWidth {
		bar += ">" + strings.Repeat(" ", progressWidth-fill-1)
	}
	line := fmt.Sprintf("%s [%s] %d/%d %3d%% %s", p.label, bar, done, p.total, 100*done/p.total,
		now.Sub(p.start).Round(100*time.Millisecond))
	pad := ""
	if n := p.lastLen - len(line); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	p.lastLen = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, pad)
}

// finish erases the bar.
func (p *progress) finish() {
	if !p.on || p.lastLen == 0 {
		return
	}
	fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.lastLen))
	p.lastLen = 0
}
