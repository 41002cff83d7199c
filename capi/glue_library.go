package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
*/
import "C"

import (
	"os"
)

func envIs(name, value string) bool { return os.Getenv(name) == value }

func glueGetABIVersion() C.uint32_t { return C.KVCM_ABI_VERSION }

func glueLiveHandleCount() C.uint64_t { return C.uint64_t(liveHandles()) }

func glueIsPoisoned() C.bool { return C.bool(isPoisoned()) }

// DebugPanicEnv enables kvcm_debug_panic.
const DebugPanicEnv = "KVCM_ENABLE_DEBUG_PANIC"

func glueDebugPanic(message string) error {
	if !envIs(DebugPanicEnv, "1") {
		return errorf(codeUnsupported, "disabled: set %s=1 to enable this test-only entry", DebugPanicEnv)
	}
	if message == "" {
		message = "kvcm_debug_panic"
	}
	panic(message)
}
