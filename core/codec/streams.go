package codec

// MultiStream is an optional interface of a ColdPageCodec. A codec whose
// MultiStream returns true keeps no state that work enqueued by one call
// shares with work enqueued by another call on a different stream (no
// scratch reused across calls, or scratch kept per stream), so the manager
// may run its calls on several streams at once: an eviction's encode beside
// an onboarding's decode. The manager orders the calls of any other codec
// across its streams: a call's work starts after the previous call's work,
// on whatever stream, has completed, as if all ran on one stream.
type MultiStream interface {
	MultiStream() bool
}

// IsMultiStream reports whether c declares MultiStream, looking through
// Guard.
func IsMultiStream(c ColdPageCodec) bool {
	if g, ok := c.(*Guarded); ok {
		c = g.inner
	}
	ms, ok := c.(MultiStream)
	return ok && ms.MultiStream()
}

// MultiStream is true: the default codec consumes its indices during the
// call and keeps nothing for the work it enqueues.
func (c *concatCodec) MultiStream() bool { return true }
