package core

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvcm/kvcm/core/config"
)

// Errors the manager and its caches return, matched with errors.Is. Every
// returned error wraps one of them with the context of the failed call, and a
// failed call changes nothing.
var (
	// ErrOutOfPages: the cache level cannot supply the pages a call needs,
	// even after evicting everything evictable.
	ErrOutOfPages = errors.New("out of pages")
	// ErrInvalidState: the call is not allowed in the cache's current status.
	ErrInvalidState = errors.New("invalid state")
	// ErrInvalidArgument: an argument is out of its documented range.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrResumeRefused: Resume was refused because the GPU level's
	// utilization by active caches is above MaxUtilForResume.
	ErrResumeRefused = errors.New("resume refused: gpu utilization above max_util_for_resume")
	// ErrInvalidConfig matches every configuration error.
	ErrInvalidConfig = config.ErrInvalid
	// ErrDataLost: a failure (an asynchronous one of a migration, a disk
	// read or a codec, or a codec's failed Decode) destroyed pages a cache
	// holds. Every call on that cache but Close returns it from the first
	// call after the failure is known; the cache can only be closed. Lost
	// pages are never published: the next request with that prefix
	// recomputes them.
	ErrDataLost = errors.New("cache data lost")
	// ErrCodecFailed: a codec's Encode or Decode failed synchronously (it
	// returned false or panicked). A failed Decode drops the pages it was
	// bringing back, as an asynchronous failure does: the cache that needed
	// them gets ErrDataLost from then on and the next request recomputes
	// them. A failed Encode leaves its pages where they were, still usable;
	// a call that needed their slots fails with ErrOutOfPages naming it as
	// the cause.
	ErrCodecFailed = errors.New("cold-page codec failed")
	// ErrIO: reading or writing a disk tier's file failed (for example
	// ENOSPC, EIO, EFBIG, or EOF from a truncated file), or a blob read back
	// failed its integrity check (it then also matches blob.ErrCorrupt: a
	// damaged, stale or foreign blob is a miss, never data). Synchronous
	// failures (creating, sizing or resizing a file) return it; an
	// asynchronous read or write failure of a page's blob loses that page
	// alone (ErrDataLost for its caches) and reaches the stream of a cache
	// that resumes it as an ErrIO.
	ErrIO = errors.New("disk i/o failed")
	// ErrClosed: the manager has been closed.
	ErrClosed = errors.New("manager closed")
)

func argErr(arg, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidArgument, arg, fmt.Sprintf(format, args...))
}

func stateErr(op string, s Status) error {
	return fmt.Errorf("%w: %s on a %v cache", ErrInvalidState, op, s)
}

// oneLine is errors.Join with a one-line message ("; " separated), which
// reads better in logs and C status messages than Join's newlines.
type oneLine []error

func (j oneLine) Error() string {
	parts := make([]string, len(j))
	for i, e := range j {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

func (j oneLine) Unwrap() []error { return j }

// joinErrs joins errs into one error (nil for none, the error itself for one).
func joinErrs(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return oneLine(errs)
}
