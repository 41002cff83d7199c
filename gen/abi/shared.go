package abi

import (
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/gen/spec"
)

// SharedStats counts the shared tier's traffic: the manager's view (blocks
// looked up, onboarded, written back or through) and its client's (keys,
// round-trip errors, the write queue), cumulative since the manager was
// created.
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out github.com/kvcm/kvcm/core.SharedStats
//kvcm:pyvalue
type SharedStats struct {
	// LookupBlocks are blocks past the local tree looked up in the shared
	// tier by kvcm_kv_cache_create and the probe calls.
	LookupBlocks int64
	// FoundBlocks are looked-up blocks the shared tier held (every missing
	// page of the block).
	FoundBlocks int64
	// OnboardedBlocks were brought from the shared tier to the first cold
	// local level.
	OnboardedBlocks int64
	// OnboardedPages are the onboarded blocks' pages.
	OnboardedPages int64
	// OnboardedBytes are the onboarded pages' payload bytes.
	OnboardedBytes int64
	// DiscardedPages were fetched but not onboarded: the tree had changed
	// meanwhile, the level had no room, or the copy could not be submitted.
	DiscardedPages int64
	// WriteBacks are pages evicted from the last local level handed to the
	// write queue (KVCM_SHARED_WRITE_BACK_ON_EVICTION).
	WriteBacks int64
	// WriteThroughs are committed pages handed to the write queue
	// (KVCM_SHARED_WRITE_THROUGH_ON_COMMIT).
	WriteThroughs int64
	// LostWrites are pages that could not be handed to the queue: their
	// slot could not be read, or the copy not submitted.
	LostWrites int64
	// Lookups are keys the client asked the cluster for.
	Lookups int64 `go:"Store.Lookups"`
	// Hits are keys found (and, for fetched blobs, verified).
	Hits int64 `go:"Store.Hits"`
	// Misses are keys not found, or lost to an error.
	Misses int64 `go:"Store.Misses"`
	// Errors are keys or round trips lost to an error (a node down, a
	// timeout, a refused command); their keys count as misses or write
	// errors.
	Errors int64 `go:"Store.Errors"`
	// Timeouts are the errors that were the call timeout running out.
	Timeouts int64 `go:"Store.Timeouts"`
	// Corrupt are blobs read back that failed their check (header, key,
	// layout fingerprint, checksum); each is also a miss.
	Corrupt int64 `go:"Store.Corrupt"`
	// BytesRead are blob bytes read from the cluster.
	BytesRead int64 `go:"Store.BytesRead"`
	// Queued are blobs accepted into the write queue.
	Queued int64 `go:"Store.Queued"`
	// Dropped are blobs refused by the write queue: it was full (its
	// queue_bytes) or the manager closing.
	Dropped int64 `go:"Store.Dropped"`
	// Deduplicated are blobs not queued because their key already was.
	Deduplicated int64 `go:"Store.Deduplicated"`
	// Present are queued blobs not written because the cluster already
	// held their key.
	Present int64 `go:"Store.Present"`
	// Written are blobs written to the cluster.
	Written int64 `go:"Store.Written"`
	// WriteErrors are queued blobs lost to an error.
	WriteErrors int64 `go:"Store.WriteErrors"`
	// BytesWritten are blob bytes written to the cluster.
	BytesWritten int64 `go:"Store.BytesWritten"`
	// FailedLandings are onboarded pages whose landing write to a disk
	// tier (shared → disk, without a host tier) failed after it was
	// submitted: each is lost when its transaction settles, and also
	// counted in lost_pages.
	FailedLandings int64 `since:"2"`
}

// NoSharedLevel is what kvcm_manager_get_shared_level reports for a manager
// without a shared tier.
//
//kvcm:since 2
const NoSharedLevel int32 = int32(abimodel.NoSharedLevel)

// ManagerGetSharedLevel returns the shared tier's level number: the number
// of local levels (kvcm_manager_get_num_levels), which no level query takes;
// events name it as the old_level of a page onboarded from the shared tier.
// Without a shared tier it is KVCM_NO_SHARED_LEVEL.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call SharedLevel
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the shared level, or KVCM_NO_SHARED_LEVEL.
type ManagerGetSharedLevel func(manager Manager, out spec.Out[CacheLevel]) *Status

// ManagerGetSharedStats returns the shared tier's cumulative counters. A
// manager without a shared tier fails with KVCM_ERR_INVALID_STATE.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call SharedStats
//kvcm:param manager in The manager.
//kvcm:param out out,result Receives the statistics.
type ManagerGetSharedStats func(manager Manager, out spec.Out[SharedStats]) *Status

// ManagerFlushShared waits, at most timeout_ms milliseconds, until the
// shared tier's writes handed over so far (blocks evicted from the last
// local level, or committed, with write-through) are written to the cluster
// or failed, and reports whether that happened in time: false when the
// timeout ran out first, the writes going on. It never waits longer than the
// timeout, and never for writes still ordered behind a migration (those are
// handed over when it completes). Without a shared tier it reports true at
// once. A timeout_ms that is not positive is KVCM_ERR_INVALID_ARGUMENT.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call FlushShared
//kvcm:param manager in The manager.
//kvcm:param timeoutMs in The longest wait in milliseconds (positive).
//kvcm:param out out,result Receives whether every write was done in time.
type ManagerFlushShared func(manager Manager, timeoutMs int64, out spec.Out[bool]) *Status
