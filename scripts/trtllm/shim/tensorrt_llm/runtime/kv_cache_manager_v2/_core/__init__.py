"""KVCacheManagerV2's core classes, as kvcm's."""

from kvcm import KVCacheManager, _KVCache  # noqa: F401
