// Package staging is kvcm's generalized staging facility: rings of scarce,
// GPU-accessible scratch memory that are leased out in byte-accurate slices
// and reused as soon as the asynchronous work of their previous owner allows.
//
// Two rings exist per StorageManager (see the design's Memory Contract):
//
//   - the pinned page ring (host-mapped memory, see NewPageRing and
//     PageRingBytes), used for two-hop GPU<->disk migrations when no host tier
//     exists; disk staging requests use the cold-page size as granularity;
//   - the device index ring (device memory, see IndexRing), allocated lazily
//     on first use, that receives H2D copies of PageIndexPair arrays for
//     codecs that consume device indices; index staging uses the 8-byte pair
//     size as granularity.
//
// # Ring
//
// A Ring owns exactly one backing allocation; its memory kind and base address
// are derived from that allocation, so they cannot diverge. The buffer is
// partitioned, in address order, into ranges. A live range is the current
// lease of a StagingBuffer. A retired range is free and remembers the
// completion event of the previous temporal owner of its bytes (or no event,
// when those bytes have no outstanding asynchronous access).
//
// Allocation is next-fit with a byte-accurate cursor: it scans the runs of
// contiguous retired ranges from the cursor to the physical end, skipping
// live ranges, then makes at most one more pass from the beginning. The
// cursor moves (to the end of the new lease) only when an allocation
// succeeds. When no run fits the minimum, Acquire fails with ErrRingFull
// instead of waiting: the lease that would have to retire belongs to the same
// thread. There is no ring-wide allocation granularity; every Request names
// its own size granularity and address alignment.
//
// Only the payload bytes of an allocation become a live range. Alignment
// padding in front of the payload and slack behind it stay retired with the
// events they inherited; padding that covers several previous ranges stays
// split at their boundaries so every fragment keeps the event protecting its
// own bytes.
//
// Merging policy: two adjacent retired ranges are merged only when they hold
// the very same event (or both hold none). Merging then loses no protection
// and adds none, so every retired range carries at most one event. Events
// are reference counted by the retired ranges that hold them and closed when
// none does any more and the event is known complete (events that may still
// be waited on by enqueued stream work are kept on a draining list and closed
// once Query reports them complete, or at Ring.Close).
//
// # StagingBuffer ownership
//
// A StagingBuffer has exactly one current owner, an optional stream: nil
// means synchronous CPU ownership with no outstanding asynchronous access.
// Acquiring with a nil stream host-synchronizes the previous completion
// events of the slice before returning (they are then closed: nobody needs to
// wait on them again); acquiring with a stream makes that stream wait on them
// without invalidating them, so other fragments and streams may still wait on
// them later. SetStream implements the transition table of the design:
//
//	old owner  new owner  transition
//	nil        nil        no action
//	nil        stream     no action (preceding CPU access is already complete)
//	stream A   stream A   no action
//	stream A   stream B   record an event on A and make B wait on it
//	stream     nil        host-synchronize the old stream
//
// Release ends the lease: a stream-owned slice records a fresh event on its
// owner stream and becomes a retired range protected by that event; a
// synchronously owned slice becomes immediately reusable (retired, no event).
// Callers must finish CPU access before a nil-to-stream transition and must
// call SetStream(stream) before submitting asynchronous work that touches a
// synchronously acquired slice.
//
// # Failures
//
// Asynchronous failures travel in events (see package device). A synchronous
// acquisition that finds a failure in a source event reports it: Acquire
// returns an error wrapping both ErrSourceFailed and the device error, and no
// lease. The failed event has nevertheless completed, so it is dropped and
// the bytes stay retired without it; retrying succeeds. A stream acquisition
// does not look at the events; the stream inherits any failure through Wait,
// as the device model says. Ring.Close reports the failures of events still
// held by retired ranges, since no acquisition will.
//
// The records this package makes (Release, SetStream A->B) close the failure
// interval of the stream they are made on, as every Record does: a caller that
// needs the failures of its own work records its own event first (as the
// migration transaction records its finish event before releasing staging).
//
// # Concurrency
//
// Rings, IndexRings and StagingBuffers are intentionally not safe for
// concurrent use. Each belongs to one KVCM instance, whose public API
// serializes access; if KVCM ever admits concurrent calls, the lock belongs at
// the KVCM boundary (one mutex per instance), not here.
//
// A StagingBuffer is a non-owning lease and must not outlive its Ring; a Ring
// refuses to Close while any lease is live.
package staging
