package abimodel

import "sync/atomic"

// Poison is a library's poisoned state. A panic that reaches the C ABI may
// have left Go state half-updated, so the library refuses every later call:
// the first panic's message is kept and reported by each refusal. Safe for
// concurrent use; the zero value is not poisoned.
type Poison struct {
	by atomic.Pointer[string] // the first panic's message; nil while not poisoned
}

// LibraryPoison is the C library's poisoned state (one per process).
var LibraryPoison Poison

// Set poisons p with msg and reports whether this call poisoned it: a later
// Set keeps the first message.
func (p *Poison) Set(msg string) bool { return p.by.CompareAndSwap(nil, &msg) }

// Poisoned reports whether p is poisoned.
func (p *Poison) Poisoned() bool { return p.by.Load() != nil }

// Reason is the message of the panic that poisoned p ("" when it is not).
func (p *Poison) Reason() string {
	if by := p.by.Load(); by != nil {
		return *by
	}
	return ""
}
