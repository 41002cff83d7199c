"""KVCacheManagerV2's storage manager: internal to KVCacheManagerV2."""

from ._internal import internal

StorageManager = internal("StorageManager")
