"""KVCacheManagerV2's life cycles: kvcm's ``AttnLifeCycle`` and
``LifeCycleId``; the registry and SSM life cycles are internal."""

from kvcm import AttnLifeCycle, LifeCycleId  # noqa: F401

from ._internal import internal

LifeCycleRegistry = internal("LifeCycleRegistry")
SsmLifeCycle = internal("SsmLifeCycle")
