package codectest

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvcm/kvcm/core/device"
)

// scratchPool hands out host-mapped buffers to codec calls. A buffer is taken
// on the calling goroutine, used by work the call enqueues, and given back by
// that work's last host function, so a later call never receives a buffer an
// earlier call's stream work still uses. Device calls (Alloc, Free) happen
// only on calling goroutines and in close, never inside host functions.
type scratchPool struct {
	dev     device.Device
	maxIdle int

	mu       sync.Mutex
	idle     []device.Memory
	inFlight int
	orphans  []device.Memory // abandoned after a partial submission: freed by close
	closed   bool
}

const minScratch = 64 << 10

func newScratchPool(dev device.Device) *scratchPool {
	return &scratchPool{dev: dev, maxIdle: 4}
}

// get returns a buffer of at least n bytes, marked in flight. It also trims
// the idle buffers that in-flight calls gave back beyond maxIdle (host
// functions cannot free them).
func (p *scratchPool) get(n int64) (device.Memory, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("codectest: scratch pool closed")
	}
	var m device.Memory
	for i, c := range p.idle {
		if c.Size() >= n {
			m = c
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			break
		}
	}
	// Keep at most maxIdle-1 idle buffers besides the one in use, so that
	// at most maxIdle remain once it is given back. Drop the smallest.
	var drop []device.Memory
	if extra := len(p.idle) - (p.maxIdle - 1); extra > 0 {
		drop = append(drop, p.idle[:extra]...)
		p.idle = append(p.idle[:0], p.idle[extra:]...)
	}
	if m != nil {
		p.inFlight++
	}
	p.mu.Unlock()
	for _, d := range drop {
		_ = d.Free() // idle: no work uses it
	}
	if m != nil {
		return m, nil
	}
	size := int64(minScratch)
	for size < n {
		size *= 2
	}
	m, err := p.dev.Alloc(device.HostMapped, size)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.inFlight++
	p.mu.Unlock()
	return m, nil
}

// put gives an in-flight buffer back; safe to call from a host function.
func (p *scratchPool) put(m device.Memory) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	if p.closed {
		p.orphans = append(p.orphans, m)
		return
	}
	// Keep idle buffers sorted by size so get takes the smallest that fits.
	i := 0
	for i < len(p.idle) && p.idle[i].Size() < m.Size() {
		i++
	}
	p.idle = append(p.idle, nil)
	copy(p.idle[i+1:], p.idle[i:])
	p.idle[i] = m
}

// orphan abandons an in-flight buffer whose release could not be enqueued:
// stream work may still use it, so it is freed only by close.
func (p *scratchPool) orphan(m device.Memory) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	p.orphans = append(p.orphans, m)
}

// stats reports idle, in-flight and orphaned buffers.
func (p *scratchPool) stats() (idle, inFlight, orphans int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle), p.inFlight, len(p.orphans)
}

// close frees every buffer not in flight. The owner must have waited for the
// codec's stream work; buffers still in flight are leaked and reported.
func (p *scratchPool) close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	free := append(p.idle, p.orphans...)
	p.idle, p.orphans = nil, nil
	inFlight := p.inFlight
	p.mu.Unlock()
	var errs []error
	for _, m := range free {
		if err := m.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	if inFlight > 0 {
		errs = append(errs, fmt.Errorf("codectest: closed with %d scratch buffers still used by enqueued work (leaked)", inFlight))
	}
	return errors.Join(errs...)
}
