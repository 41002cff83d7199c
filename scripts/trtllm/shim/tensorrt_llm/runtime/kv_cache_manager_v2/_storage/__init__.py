"""KVCacheManagerV2's storage classes: internal to KVCacheManagerV2."""
