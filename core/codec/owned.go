package codec

import (
	"errors"
	"sync"
)

// ErrConsumed is returned by an *Owned whose codec was already taken.
var ErrConsumed = errors.New("codec: codec already consumed (ownership was transferred)")

// Owned is the transfer handle of a codec: exactly one taker gets the codec,
// and after that the handle is unusable. The manager constructor takes a
// non-nil *Owned as its first act, so a supplied codec is consumed whether
// construction then succeeds or fails, and the constructor destroys it (see
// Destroy) on failure. This mirrors passing std::unique_ptr by value in the
// design and the C ABI's consume-even-on-failure rule.
//
// An Owned is safe for concurrent use; of concurrent Takes exactly one wins.
type Owned struct {
	mu    sync.Mutex
	c     ColdPageCodec
	taken bool
}

// Own wraps c for transfer. The caller must not keep or use c afterwards. Own
// of a nil codec returns nil, which the manager reads as "use the default".
func Own(c ColdPageCodec) *Owned {
	if c == nil {
		return nil
	}
	return &Owned{c: c}
}

// Take transfers the codec to the caller, who becomes responsible for
// destroying it. It succeeds once; later calls return ErrConsumed. Take of a
// nil *Owned returns (nil, nil): no codec was supplied.
func (o *Owned) Take() (ColdPageCodec, error) {
	if o == nil {
		return nil, nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.taken {
		return nil, ErrConsumed
	}
	c := o.c
	o.c, o.taken = nil, true
	return c, nil
}

// Consumed reports whether the codec was taken (or discarded).
func (o *Owned) Consumed() bool {
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.taken
}

// Discard takes the codec and destroys it, for a holder that will never hand
// it on. It returns ErrConsumed if the codec was already taken.
func (o *Owned) Discard() error {
	c, err := o.Take()
	if err != nil || c == nil {
		return err
	}
	return Destroy(c)
}

// CreateDefaultColdPageCodec returns the default lossless concatenating codec
// wrapped for transfer. It is not needed to select the default (a manager
// given no codec creates it); it exists as the reference for codec authors and
// as a demonstration of the ownership-transfer contract.
func CreateDefaultColdPageCodec() *Owned { return Own(NewDefault()) }
