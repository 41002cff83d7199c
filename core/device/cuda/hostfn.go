//go:build cgo

package cuda

/*
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
)

// hostJob is one host function in flight: a caller's function, or the
// inheritance of a waited event's failure. It fails the intervals that were
// current on its stream when it was enqueued.
type hostJob struct {
	fn       func() error
	inherit  *interval // non-nil: copy this interval's failure
	ev, sync *interval
	stream   uintptr
}

func (j *hostJob) run() {
	var err error
	if j.inherit != nil {
		err = j.inherit.result()
	} else {
		err = j.call()
	}
	if err != nil {
		j.ev.fail(err)
		j.sync.fail(err)
	}
}

// call runs the caller's function, converting a panic into an error: a panic
// must never unwind into the driver's thread.
func (j *hostJob) call() (err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(error); ok {
				err = fmt.Errorf("cuda: stream %#x: host function panicked: %w", j.stream, e)
			} else {
				err = fmt.Errorf("cuda: stream %#x: host function panicked: %v", j.stream, r)
			}
		}
	}()
	if err := j.fn(); err != nil {
		return fmt.Errorf("cuda: stream %#x: host function: %w", j.stream, err)
	}
	return nil
}

// kvcmCudaHostFunc is the target of cuLaunchHostFunc (through the C
// trampoline in shim.c): h is a cgo.Handle of a *hostJob, used exactly once.
//
//export kvcmCudaHostFunc
func kvcmCudaHostFunc(h C.uintptr_t) {
	hd := cgo.Handle(h)
	j := hd.Value().(*hostJob)
	hd.Delete()
	j.run()
}
