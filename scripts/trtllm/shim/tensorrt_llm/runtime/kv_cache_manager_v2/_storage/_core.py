"""KVCacheManagerV2's storage classes: internal to KVCacheManagerV2."""

from .._internal import internal

CacheLevelStorage = internal("CacheLevelStorage")
PoolGroupBase = internal("PoolGroupBase")
SlotAllocator = internal("SlotAllocator")
