"""KVCacheManagerV2's radix tree: kvcm's ReuseScope; the tree, its blocks
and its sha256 hasher are internal to KVCacheManagerV2."""

from kvcm import ReuseScope, sequence_to_blockchain_keys  # noqa: F401

from ._internal import internal

Hasher = internal("Hasher")
Block = internal("Block")
BlockRadixTree = internal("BlockRadixTree")
