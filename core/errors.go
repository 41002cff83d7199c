package core

import (
	"errors"
	"fmt"

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
	// ErrDataLost: an asynchronous failure (for example of a codec)
	// destroyed pages a cache holds; the cache can only be closed.
	ErrDataLost = errors.New("cache data lost")
	// ErrClosed: the manager has been closed.
	ErrClosed = errors.New("manager closed")
)

func argErr(arg, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidArgument, arg, fmt.Sprintf(format, args...))
}

func stateErr(op string, s Status) error {
	return fmt.Errorf("%w: %s on a %v cache", ErrInvalidState, op, s)
}
