package abitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include "kvcm/kvcm.h"
*/
import "C"

// SharedStats is a kvcm_shared_stats.
type SharedStats struct {
	LookupBlocks, FoundBlocks                       int64
	OnboardedBlocks, OnboardedPages, OnboardedBytes int64
	DiscardedPages, WriteBacks, WriteThroughs       int64
	LostWrites                                      int64
	Lookups, Hits, Misses, Errors, Timeouts         int64
	Corrupt, BytesRead, Queued, Dropped             int64
	Deduplicated, Present, Written, WriteErrors     int64
	BytesWritten, FailedLandings                    int64
}

// NoSharedLevel is KVCM_NO_SHARED_LEVEL.
const NoSharedLevel = int32(C.KVCM_NO_SHARED_LEVEL)

// SharedLevel calls kvcm_manager_get_shared_level.
func SharedLevel(m uint64) (int32, error) {
	var out C.kvcm_cache_level
	err := status(C.kvcm_manager_get_shared_level(C.kvcm_manager(m), &out))
	return int32(out), err
}

// GetSharedStats calls kvcm_manager_get_shared_stats.
func GetSharedStats(m uint64) (SharedStats, error) {
	var s C.kvcm_shared_stats
	err := status(C.kvcm_manager_get_shared_stats(C.kvcm_manager(m), &s))
	return SharedStats{
		LookupBlocks: int64(s.lookup_blocks), FoundBlocks: int64(s.found_blocks),
		OnboardedBlocks: int64(s.onboarded_blocks), OnboardedPages: int64(s.onboarded_pages),
		OnboardedBytes: int64(s.onboarded_bytes), DiscardedPages: int64(s.discarded_pages),
		WriteBacks: int64(s.write_backs), WriteThroughs: int64(s.write_throughs), LostWrites: int64(s.lost_writes),
		Lookups: int64(s.lookups), Hits: int64(s.hits), Misses: int64(s.misses), Errors: int64(s.errors),
		Timeouts: int64(s.timeouts), Corrupt: int64(s.corrupt), BytesRead: int64(s.bytes_read),
		Queued: int64(s.queued), Dropped: int64(s.dropped), Deduplicated: int64(s.deduplicated),
		Present: int64(s.present), Written: int64(s.written), WriteErrors: int64(s.write_errors),
		BytesWritten: int64(s.bytes_written), FailedLandings: int64(s.failed_landings),
	}, err
}

// FlushShared calls kvcm_manager_flush_shared.
func FlushShared(m uint64, timeoutMs int64) (bool, error) {
	var out C.bool
	err := status(C.kvcm_manager_flush_shared(C.kvcm_manager(m), C.int64_t(timeoutMs), &out))
	return bool(out), err
}

// FlushSharedNullOut calls kvcm_manager_flush_shared with a NULL out.
func FlushSharedNullOut(m uint64) error {
	return status(C.kvcm_manager_flush_shared(C.kvcm_manager(m), 1000, nil))
}
