"""KVCacheManagerV2's cache class; its private statistics recorders are
internal (kvcm counts in its core)."""

from kvcm import _KVCache as KvCache  # noqa: F401
from kvcm import _KVCache  # noqa: F401
