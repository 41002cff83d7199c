package staging

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kvcm/kvcm/core/device"
)

// fakeDevice is a small device.Device for tests. Every stream runs its work
// in order on its own goroutine; a test can Hold a stream so that nothing
// enqueued after the Hold runs (and no event recorded after it completes)
// until the test lets it go. Every call that matters to the staging contract
// is appended to a log ("new e1", "record e1 s1", "wait s2 e1", "sync s1",
// "evsync e1", "close e1", "alloc ...", "free ...").
type fakeDevice struct {
	// The nil embedded interface keeps the fake a device.Device as the
	// interface grows; methods staging does not use panic if called.
	device.Device

	mu      sync.Mutex
	log     []string
	nEvents int
	streams map[uintptr]*fakeStream
	mems    []*fakeMem
	events  []*fakeEvent
	// base is the address of the next allocation; tests set it to exercise
	// absolute alignment.
	base device.Ptr
	// injected synchronous failures
	failNewEvent error
	failAlloc    error
}

func newFakeDevice(t *testing.T) *fakeDevice {
	d := &fakeDevice{streams: map[uintptr]*fakeStream{}, base: 0x100000}
	t.Cleanup(func() {
		d.mu.Lock()
		ss := make([]*fakeStream, 0, len(d.streams))
		for _, s := range d.streams {
			ss = append(ss, s)
		}
		d.mu.Unlock()
		for _, s := range ss {
			s.releaseHolds()
			_ = s.Close()
		}
	})
	return d
}

func (d *fakeDevice) logf(format string, args ...any) {
	d.mu.Lock()
	d.log = append(d.log, fmt.Sprintf(format, args...))
	d.mu.Unlock()
}

// takeLog returns the log so far and clears it.
func (d *fakeDevice) takeLog() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.log
	d.log = nil
	return l
}

func (d *fakeDevice) countAllocs() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.mems)
}

func (d *fakeDevice) Name() string { return "fake" }

func (d *fakeDevice) Alloc(kind device.MemoryKind, size int64) (device.Memory, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failAlloc != nil {
		return nil, d.failAlloc
	}
	m := &fakeMem{d: d, ptr: d.base, kind: kind, buf: make([]byte, size)}
	d.base = d.base.Add((size + 0xfffff) &^ 0xfffff)
	d.mems = append(d.mems, m)
	d.log = append(d.log, fmt.Sprintf("alloc %v %d", kind, size))
	return m, nil
}

func (d *fakeDevice) NewStream() (device.Stream, error) {
	d.mu.Lock()
	h := uintptr(len(d.streams) + 1)
	s := &fakeStream{d: d, name: fmt.Sprintf("s%d", h), handle: h, ops: make(chan func(), 1024), done: make(chan struct{})}
	d.streams[h] = s
	d.mu.Unlock()
	go s.run()
	return s, nil
}

func (d *fakeDevice) NewEvent() (device.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failNewEvent != nil {
		return nil, d.failNewEvent
	}
	d.nEvents++
	e := &fakeEvent{d: d, name: fmt.Sprintf("e%d", d.nEvents), st: completeState()}
	d.events = append(d.events, e)
	d.log = append(d.log, "new "+e.name)
	return e, nil
}

func (d *fakeDevice) StreamFromHandle(h uintptr) (device.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.streams[h]; ok {
		return s, nil
	}
	return nil, device.ErrUnknownStream
}

func (d *fakeDevice) AdoptStream(h uintptr) (device.Stream, error) {
	return nil, fmt.Errorf("fake device: adopt stream %#x: not supported", h)
}

func (d *fakeDevice) Close() error { return nil }

// event returns the fake event called name.
func (d *fakeDevice) event(name string) *fakeEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.events {
		if e.name == name {
			return e
		}
	}
	return nil
}

type fakeMem struct {
	device.Memory // see fakeDevice

	d     *fakeDevice
	ptr   device.Ptr
	kind  device.MemoryKind
	buf   []byte
	freed bool
}

func (m *fakeMem) Ptr() device.Ptr         { return m.ptr }
func (m *fakeMem) Size() int64             { return int64(len(m.buf)) }
func (m *fakeMem) Kind() device.MemoryKind { return m.kind }
func (m *fakeMem) Host() []byte {
	if m.kind == device.HostMapped {
		return m.buf
	}
	return nil
}
func (m *fakeMem) Free() error {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	if m.freed {
		return device.ErrClosed
	}
	m.freed = true
	m.d.log = append(m.d.log, fmt.Sprintf("free %v", m.kind))
	return nil
}

// evState is one recording of an event: done is closed when the work
// captured by that Record has completed, and err is then its failure.
type evState struct {
	done chan struct{}
	err  error
}

func completeState() *evState {
	st := &evState{done: make(chan struct{})}
	close(st.done)
	return st
}

type fakeEvent struct {
	device.Event // see fakeDevice

	d    *fakeDevice
	name string

	mu     sync.Mutex
	st     *evState
	closes int
	syncs  int
}

func (e *fakeEvent) state() *evState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st
}

func (e *fakeEvent) Query() (bool, error) {
	st := e.state()
	select {
	case <-st.done:
		return true, st.err
	default:
		return false, nil
	}
}

func (e *fakeEvent) Synchronize() error {
	e.mu.Lock()
	e.syncs++
	st := e.st
	e.mu.Unlock()
	e.d.logf("evsync %s", e.name)
	<-st.done
	return st.err
}

func (e *fakeEvent) Close() error {
	e.mu.Lock()
	e.closes++
	e.mu.Unlock()
	e.d.logf("close %s", e.name)
	return nil
}

func (e *fakeEvent) closeCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closes
}

func (e *fakeEvent) done() bool {
	ok, _ := e.Query()
	return ok
}

type fakeStream struct {
	device.Stream // see fakeDevice

	d      *fakeDevice
	name   string
	handle uintptr
	ops    chan func()
	done   chan struct{}

	// evErr is the first asynchronous failure since the last Record, syncErr
	// since the last Record or Synchronize (the device package's two
	// intervals); only the stream goroutine touches them.
	evErr, syncErr error

	mu         sync.Mutex
	holds      []chan struct{}
	closed     bool
	failRecord error
	failWait   error
}

func (s *fakeStream) run() {
	defer close(s.done)
	for op := range s.ops {
		op()
	}
}

func (s *fakeStream) enqueue(op func()) {
	s.ops <- op
}

func (s *fakeStream) fail(err error) {
	if err != nil && s.evErr == nil {
		s.evErr = err
	}
	if err != nil && s.syncErr == nil {
		s.syncErr = err
	}
}

// Hold stops the stream at this point: nothing enqueued later runs until the
// returned function is called.
func (s *fakeStream) Hold() (release func()) {
	g := make(chan struct{})
	s.mu.Lock()
	s.holds = append(s.holds, g)
	s.mu.Unlock()
	s.enqueue(func() { <-g })
	var once sync.Once
	return func() { once.Do(func() { close(g) }) }
}

func (s *fakeStream) releaseHolds() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.holds {
		select {
		case <-g:
		default:
			close(g)
		}
	}
	s.holds = nil
}

func (s *fakeStream) BatchCopy(descs []device.CopyDesc) error {
	s.d.logf("copy %s %d", s.name, len(descs))
	s.enqueue(func() {})
	return nil
}

func (s *fakeStream) CopyFromHost(dst device.Ptr, src []byte) error {
	data := append([]byte(nil), src...) // consumed before returning
	s.d.logf("h2d %s %d", s.name, len(src))
	s.enqueue(func() {
		s.d.mu.Lock()
		defer s.d.mu.Unlock()
		for _, m := range s.d.mems {
			if !m.freed && dst >= m.ptr && int64(dst-m.ptr)+int64(len(data)) <= int64(len(m.buf)) {
				copy(m.buf[dst-m.ptr:], data)
				return
			}
		}
		s.fail(device.ErrInvalidCopy)
	})
	return nil
}

func (s *fakeStream) HostFunc(fn func() error) error {
	s.enqueue(func() { s.fail(fn()) })
	return nil
}

func (s *fakeStream) Record(ev device.Event) error {
	s.mu.Lock()
	err := s.failRecord
	s.mu.Unlock()
	if err != nil {
		return err
	}
	e := ev.(*fakeEvent)
	st := &evState{done: make(chan struct{})}
	e.mu.Lock()
	e.st = st
	e.mu.Unlock()
	s.d.logf("record %s %s", e.name, s.name)
	s.enqueue(func() {
		st.err = s.evErr
		s.evErr, s.syncErr = nil, nil
		close(st.done)
	})
	return nil
}

func (s *fakeStream) Wait(ev device.Event) error {
	s.mu.Lock()
	err := s.failWait
	s.mu.Unlock()
	if err != nil {
		return err
	}
	e := ev.(*fakeEvent)
	st := e.state() // CUDA semantics: the wait captures the latest Record
	s.d.logf("wait %s %s", s.name, e.name)
	s.enqueue(func() {
		<-st.done
		s.fail(st.err)
	})
	return nil
}

func (s *fakeStream) Synchronize() error {
	s.d.logf("sync %s", s.name)
	ch := make(chan error, 1)
	s.enqueue(func() {
		ch <- s.syncErr
		s.syncErr = nil
	})
	return <-ch
}

func (s *fakeStream) Handle() uintptr { return s.handle }

func (s *fakeStream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.ops)
	<-s.done
	return nil
}

func (d *fakeDevice) stream(t *testing.T) *fakeStream {
	t.Helper()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	return s.(*fakeStream)
}

// layout renders the ring's partition: "L[0,16)" for a live range,
// "R[16,32)" for a retired one without event, "R[16,32)e2" with event e2.
// Offsets are relative to the ring base.
func layout(r *Ring) string {
	var b strings.Builder
	for s := r.head; s != nil; s = s.next {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if s.live() {
			fmt.Fprintf(&b, "L[%d,%d)", s.off, s.end)
			continue
		}
		fmt.Fprintf(&b, "R[%d,%d)", s.off, s.end)
		if s.ev != nil {
			b.WriteString(s.ev.ev.(*fakeEvent).name)
		}
	}
	return b.String()
}

// refs returns the reference count the ring keeps for the named event, and
// checks it against the number of retired ranges holding it.
func refs(t *testing.T, r *Ring, name string) int {
	t.Helper()
	n := 0
	var se *sharedEvent
	for s := r.head; s != nil; s = s.next {
		if s.ev != nil && s.ev.ev.(*fakeEvent).name == name {
			n++
			se = s.ev
		}
	}
	if se != nil && se.refs != n {
		t.Fatalf("event %s: refs %d but held by %d ranges", name, se.refs, n)
	}
	return n
}
