//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"fmt"
	"sync"
	"unsafe"

	"github.com/kvcm/kvcm/core/device"
)

// Module is a loaded kernel image (PTX or cubin).
type Module struct {
	dev *Device
	h   C.kv_CUmodule

	mu     sync.Mutex
	closed bool
}

// Function is a kernel of a Module.
type Function struct {
	mod  *Module
	h    C.kv_CUfunction
	name string
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// LoadModule loads a kernel image with cuModuleLoadDataEx (PTX is compiled by
// the driver's JIT for this GPU). PTX text need not be NUL-terminated. A JIT
// error carries the driver's error log.
func (d *Device) LoadModule(image []byte) (*Module, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda: load module: %w", device.ErrClosed)
	}
	if len(image) == 0 {
		return nil, fmt.Errorf("cuda: load module: empty image")
	}
	if image[len(image)-1] != 0 && !bytes.HasPrefix(image, []byte("\x7fELF")) {
		image = append(image[:len(image):len(image)], 0)
	}
	m := &Module{dev: d}
	log := (*C.char)(C.calloc(8192, 1))
	defer C.free(unsafe.Pointer(log))
	r := C.kv_module_load(d.ctx, &m.h, unsafe.Pointer(&image[0]), log, 8192)
	if err := check("cuModuleLoadDataEx", r); err != nil {
		if s := C.GoString(log); s != "" {
			return nil, fmt.Errorf("%w: %s", err, s)
		}
		return nil, err
	}
	d.mu.Lock()
	d.modules[m] = struct{}{}
	d.mu.Unlock()
	return m, nil
}

// Function looks up kernel name (an extern "C" name) in the module.
func (m *Module) Function(name string) (*Function, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.dev.closed.Load() {
		return nil, fmt.Errorf("cuda: function %s: %w", name, device.ErrClosed)
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	f := &Function{mod: m, name: name}
	if err := checkf(C.kv_module_function(m.dev.ctx, &f.h, m.h, cname), "cuModuleGetFunction(%s)", name); err != nil {
		return nil, err
	}
	return f, nil
}

// Close unloads the module; its functions must no longer be launched, and
// work already launched must have completed.
func (m *Module) Close() error {
	m.dev.mu.Lock()
	delete(m.dev.modules, m)
	m.dev.mu.Unlock()
	return m.unload()
}

func (m *Module) unload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("cuda: module: close: %w", device.ErrClosed)
	}
	m.closed = true
	return check("cuModuleUnload", C.kv_module_unload(m.dev.ctx, m.h))
}

// Name is the kernel's name.
func (f *Function) Name() string { return f.name }

func (f *Function) attr(a C.int, what string) (int, error) {
	var v C.int
	err := checkf(C.kv_func_attr(f.mod.dev.ctx, f.h, a, &v), "cuFuncGetAttribute(%s, %s)", f.name, what)
	return int(v), err
}

// NumRegs is the number of registers each thread of the kernel uses.
func (f *Function) NumRegs() (int, error) {
	return f.attr(C.KV_CU_FUNC_ATTRIBUTE_NUM_REGS, "NUM_REGS")
}

// MaxThreadsPerBlock is the largest block the kernel can be launched with.
func (f *Function) MaxThreadsPerBlock() (int, error) {
	return f.attr(C.KV_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "MAX_THREADS_PER_BLOCK")
}

// MaxKernelArgs is the most parameters Launch passes.
const MaxKernelArgs = 32

// Launch enqueues f on the stream with the given grid, block and dynamic
// shared memory. Every kernel parameter is 8 bytes wide (pointers, 64-bit
// integers): args[i] is parameter i. A kernel that faults makes the context
// fail (sticky in CUDA): later synchronizations report the driver's error.
func (s *Stream) Launch(f *Function, grid, block Dim3, sharedBytes uint32, args ...uint64) error {
	if f == nil || f.mod.dev != s.dev {
		return fmt.Errorf("cuda: stream %#x: launch: function of another device", s.handle)
	}
	if len(args) > MaxKernelArgs {
		return fmt.Errorf("cuda: stream %#x: launch %s: %d arguments, at most %d", s.handle, f.name, len(args), MaxKernelArgs)
	}
	if err := s.lock("launch"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	var argp *C.uint64_t
	if len(args) > 0 {
		argp = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	r := C.kv_launch(s.dev.ctx, s.h, f.h, C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z), C.uint(sharedBytes), argp, C.int(len(args)))
	return checkf(r, "stream %#x: cuLaunchKernel(%s, grid %v, block %v)", s.handle, f.name, grid, block)
}
