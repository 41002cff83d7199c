"""KVCacheManagerV2's disaggregated transfer layout: aggregated pages,
aggregated page indices, page index converters and tokens_per_block
overrides, through both backends."""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
from conftest import small_config

from kvcm import (
    AggregatedPageDesc,
    AttentionLayerConfig,
    BufferConfig,
    BufferId,
    ExpandedBuffer,
    GpuCacheTierConfig,
    InvalidArgumentError,
    InvalidConfigError,
    KVCacheManager,
    KVCacheManagerConfig,
    PageIndexMode,
    SwaScratchReuseConfig,
)


def test_aggregated_pages_merge_contiguous_buffers(backend):
    """Buffers adjacent in a pool's slot merge into one run whatever order
    they are given in; a gap splits the run; runs come per (layer group,
    pool) in the order each first appears."""
    with KVCacheManager(small_config(), device="emu") as m:
        v0 = m.get_buffer_location(0, "value")
        runs = list(m.get_aggregated_pages([BufferId(1, "key"), (0, "value"), BufferId(1, "value")]))
        assert runs == [AggregatedPageDesc(
            v0.pool_base + 64, 192, 256, 0,
            (ExpandedBuffer(BufferId(0, "value"), 1), ExpandedBuffer(BufferId(1, "key"), 1),
             ExpandedBuffer(BufferId(1, "value"), 1)))]
        split = list(m.get_aggregated_pages([(2, "value"), (1, "value"), (0, "key")]))
        assert [(d.layer_group_id, d.base - v0.pool_base if d.layer_group_id == 0 else None, d.size) for d in split] == [
            (m.get_layer_group_id(2), None, 32), (0, 0, 64), (0, 192, 64)]
        assert list(m.get_aggregated_pages([])) == []
        everything = list(m.get_aggregated_pages(m.all_buffer_ids))
        assert sorted(b.id for d in everything for b in d.buffers) == sorted(m.all_buffer_ids)
        assert len(everything) == 2, "one run per pool"


def test_aggregated_pages_refuse_unknown_and_repeated_buffers(backend):
    with KVCacheManager(small_config(), device="emu") as m:
        with pytest.raises(InvalidArgumentError, match=r'buffers\[1\]: no buffer "index" in layer 0'):
            list(m.get_aggregated_pages([(0, "key"), (0, "index")]))
        with pytest.raises(InvalidArgumentError, match=r"buffers\[1\].*buffers\[0\] already"):
            list(m.get_aggregated_pages([(0, "key"), (0, "key")]))
        with pytest.raises(InvalidArgumentError, match=r"buffers\[0\]\.role: contains a NUL"):
            list(m.get_aggregated_pages([(0, "key\0x")]))


def test_aggregated_page_desc_addresses_the_buffers_bytes(backend):
    """base + stride * i for each aggregated page index i of a cache holds
    the run's buffers side by side, as their own page addresses say."""
    with KVCacheManager(small_config(), device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(input_tokens=list(range(12))) as c:
            c.resume(s)
            c.resize(12)
            (d,) = m.get_aggregated_pages([(0, "value"), (1, "key")])
            idx = list(c.get_aggregated_page_indices(d.layer_group_id))
            assert idx == list(c.get_base_page_indices(d.layer_group_id))
            for b, i in enumerate(idx):
                at = d.base + d.stride * i
                for eb in d.buffers:
                    loc = m.get_buffer_location(*eb.id)
                    assert loc.page_address(c.get_base_page_indices(loc.layer_group)[b]) == at
                    at += loc.bytes
                assert at == d.base + d.stride * i + d.size
            c.suspend()


def test_aggregated_page_indices_valid_only_and_beam(backend):
    """valid_only drops the blocks a sliding window released; every beam has
    its own indices, and a beam outside the beam width is refused."""
    with KVCacheManager(small_config(), device="emu") as m:
        s = m.create_stream()
        swa = m.get_layer_group_id(2)
        with m.create_kv_cache(input_tokens=list(range(20))) as c:
            c.resume(s)
            c.resize(20, 20)
            full = list(c.get_aggregated_page_indices(swa))
            assert full == list(c.get_base_page_indices(swa)) and full[0] == -1
            assert list(c.get_aggregated_page_indices(swa, valid_only=True)) == [i for i in full if i != -1]
            with pytest.raises(InvalidArgumentError, match="beam"):
                list(c.get_aggregated_page_indices(swa, 1))
            c.beam_width = 2
            c.resize(24)  # a new block: a page per beam
            for beam in range(2):
                assert list(c.get_aggregated_page_indices(0, beam)) == list(c.get_base_page_indices(0, beam))
            assert list(c.get_aggregated_page_indices(0, 1))[-1] != list(c.get_aggregated_page_indices(0, 0))[-1]
            c.suspend()


def test_tokens_per_block_override_expands_the_buffers_pages(backend):
    """A buffer with tokens_per_block_override holds tokens_per_block //
    override pages a block: the converter's expansion, a stride of one such
    page, an upper bound counted in them, and every converted index inside
    its block's page."""
    layers = [AttentionLayerConfig(0, [BufferConfig("key", 64), BufferConfig("index", 16, tokens_per_block_override=2)])]
    with KVCacheManager(small_config(layers=layers), device="emu") as m:
        loc = m.get_buffer_location(0, "index")
        conv = m.get_page_index_converter(0, "index")
        assert (conv.scale, conv.expansion, conv.layer_offset) == (loc.scale, 2, loc.offset)
        assert loc.bytes == 32 and m.get_page_stride(0, "index") == 16
        (d,) = m.get_aggregated_pages([(0, "index")])
        assert d.buffers == (ExpandedBuffer(BufferId(0, "index"), 2),) and d.size == 32
        base = [3, -1, 0]
        for mode in (PageIndexMode.SHARED, PageIndexMode.PER_LAYER):
            addr = m.get_mem_pool_base_address(0, "index", mode)
            kidx = conv(base, mode)
            assert kidx[2:4] == [-1, -1]
            for j, b in ((0, 3), (4, 0)):
                assert [addr + k * 16 for k in kidx[j:j + 2]] == [loc.page_address(b), loc.page_address(b) + 16]
        slots = m.pool_group_descs[0].num_slots
        assert m.get_page_index_upper_bound(0, "index") == (loc.scale * slots - loc.offset) * 2


@pytest.mark.parametrize("override, match", [(3, "must divide"), (0, "must be positive"), (-2, "must be positive")])
def test_tokens_per_block_override_must_divide_tokens_per_block(override, match):
    layers = [AttentionLayerConfig(0, [BufferConfig("key", 64, tokens_per_block_override=override)])]
    with pytest.raises(InvalidConfigError, match=match) as e:
        KVCacheManager(small_config(layers=layers), device="emu")
    assert e.value.field == "layers[0].buffers[0].tokens_per_block_override"


def test_converter_expands_scratch_mapped_indices(backend):
    """With SWA scratch reuse, a buffer's expanded indices of scratch blocks
    are the scratch-mapped indices, each expanded as any other."""
    kv = [BufferConfig("key", 64), BufferConfig("index", 16, tokens_per_block_override=2)]
    layers = [AttentionLayerConfig(0, kv)] + [AttentionLayerConfig(i, kv, sliding_window_size=8) for i in range(1, 3)]
    cfg = KVCacheManagerConfig(tokens_per_block=4, cache_tiers=[GpuCacheTierConfig(64 << 10)], layers=layers,
                               swa_scratch_reuse=SwaScratchReuseConfig(0))
    with KVCacheManager(cfg, device="emu") as m:
        with m.create_kv_cache(None, list(range(64))) as c:
            assert c.resume(m.create_stream()) and c.resize(64)
            d = c.get_scratch_desc(1)
            assert d is not None and d.range.end > d.range.beg
            base = list(c.get_base_page_indices(1))
            conv = m.get_page_index_converter(1, "index")
            assert conv.expansion == 2
            plain = dataclasses.replace(conv, expansion=1)(base, PageIndexMode.PER_LAYER, d)
            assert conv(base, PageIndexMode.PER_LAYER, d) == [p * 2 + k for p in plain for k in range(2)]
            assert all(p != -1 for p in plain[d.range.beg:d.range.end]), "scratch blocks map into their slots"
            c.suspend()
