"""KVCacheManagerV2's copy engine (used to move aggregated pages between
managers): internal to KVCacheManagerV2."""

from ._internal import internal

CopyTask = internal("CopyTask")
batched_copy = internal("batched_copy")
