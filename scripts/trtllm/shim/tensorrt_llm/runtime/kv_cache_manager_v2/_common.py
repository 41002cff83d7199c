"""KVCacheManagerV2's ``_common``: kvcm's constants and type aliases."""

from kvcm import (  # noqa: F401
    BAD_PAGE_INDEX,
    CACHE_LEVEL1,
    DEFAULT_BEAM_INDEX,
    GPU_LEVEL,
    NDEBUG,
    BeamIndex,
    CacheLevel,
    CacheTier,
    CudaStream,
    DataRole,
    LayerGroupId,
    LayerId,
    LifeCycleId,
    MemAddress,
    PageIndexMode,
    PageStatus,
    PoolGroupIndex,
    PoolIndex,
    Priority,
    SlidingWindowSize,
    TokenId,
    TokenIdExt,
)

PRIORITY_DEFAULT = 35
