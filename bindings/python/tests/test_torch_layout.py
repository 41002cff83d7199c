"""kvcm.torch's contracts: the pool arrays it describes (shape, strides,
__cuda_array_interface__) address exactly the pages the manager gives a
cache, and `import kvcm` never imports torch. The torch-free half runs
everywhere; the tests at the end need torch and CUDA."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import HERE

from kvcm import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, KVCacheManager, KVCacheManagerConfig
from kvcm._torch_layout import PoolMemory, kernel_page_indices, pool_layout

TPB = 8
KV_HEADS, HEAD_DIM, ITEM = 2, 4, 2  # a token of K or V: 2 heads x 4 elements of fp16
TOK = KV_HEADS * HEAD_DIM * ITEM


def kv_config() -> KVCacheManagerConfig:
    """Full-attention layers, a sliding-window layer, and a layer whose value
    buffer has pages of half a block (expansion 2)."""
    layers = [AttentionLayerConfig(i, [BufferConfig("key", TPB * TOK), BufferConfig("value", TPB * TOK)])
              for i in range(3)]
    layers.append(AttentionLayerConfig(3, [BufferConfig("key", TPB * TOK), BufferConfig("value", TPB * TOK)],
                                       sliding_window_size=2 * TPB))
    layers.append(AttentionLayerConfig(4, [BufferConfig("key", TPB * TOK),
                                           BufferConfig("value", TPB // 2 * TOK, tokens_per_block_override=TPB // 2)]))
    return KVCacheManagerConfig(tokens_per_block=TPB, cache_tiers=[GpuCacheTierConfig(1 << 20)], layers=layers,
                                enable_partial_reuse=False)


BUFFERS = [(lid, role) for lid in range(5) for role in ("key", "value")]


def test_import_kvcm_does_not_import_torch():
    # kvcm.torch is opt-in: importing the package must not pull torch in.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    code = "import sys, kvcm; assert 'torch' not in sys.modules, 'kvcm imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_layout_shape_is_pages_by_tokens_by_token_shape():
    # Each buffer's pool is (upper bound pages, tokens per page, heads, dim), C-contiguous.
    with KVCacheManager(kv_config(), device="emu") as m:
        for lid, role in BUFFERS:
            lay = pool_layout(m, lid, role, (KV_HEADS, HEAD_DIM), ITEM)
            tpp = TPB // 2 if (lid, role) == (4, "value") else TPB
            assert lay.shape == (m.get_page_index_upper_bound(lid, role), tpp, KV_HEADS, HEAD_DIM)
            assert lay.page_bytes == m.get_page_stride(lid, role) == tpp * TOK
            assert lay.strides == (tpp * TOK, TOK, HEAD_DIM * ITEM, ITEM)
            assert lay.base == m.get_mem_pool_base_address(lid, role)


def test_cuda_array_interface_describes_the_pool_bytes():
    # Version 3, read-write, the pool's base, as bytes or as the token dtype.
    with KVCacheManager(kv_config(), device="emu") as m:
        lay = pool_layout(m, 1, "value", (KV_HEADS, HEAD_DIM), ITEM)
        cai = PoolMemory(m, lay).__cuda_array_interface__
        assert cai == {"shape": (lay.num_pages, lay.page_bytes), "typestr": "|u1", "data": (lay.base, False),
                       "strides": None, "version": 3, "stream": None}
        typed = lay.cuda_array_interface("<f2")
        assert typed["shape"] == lay.shape and typed["typestr"] == "<f2"
        with pytest.raises(ValueError, match="typestr"):
            lay.cuda_array_interface("<f4")


def test_a_token_shape_that_does_not_fill_a_page_is_refused():
    # The error names token_shape and the sizes that disagree.
    with KVCacheManager(kv_config(), device="emu") as m:
        with pytest.raises(ValueError, match=r"token_shape: .* a page of layer 0 role 'key' is 128"):
            pool_layout(m, 0, "key", (KV_HEADS, HEAD_DIM), 4)
        with pytest.raises(ValueError, match="token_shape"):
            pool_layout(m, 0, "key", (0, HEAD_DIM), ITEM)


def test_kernel_indices_address_the_cache_pages_and_nothing_else():
    # Page p of the array is the manager's page: base + index * page_bytes is the
    # buffer location's address of the block, every page lies inside the
    # array, and no two buffers' pages of the cache overlap.
    with KVCacheManager(kv_config(), device="emu") as m:
        s = m.create_stream()
        prompt = list(range(100, 100 + 5 * TPB))
        with m.create_kv_cache(input_tokens=prompt) as c:
            assert c.resume(s)
            c.resize(len(prompt))
            spans = []
            for lid, role in BUFFERS:
                lay = pool_layout(m, lid, role, (KV_HEADS, HEAD_DIM), ITEM)
                loc = m.get_buffer_location(lid, role)
                base = list(c.get_base_page_indices(loc.layer_group))
                kidx = kernel_page_indices(m, c, lid, role)
                e = len(kidx) // len(base)
                assert e == (2 if (lid, role) == (4, "value") else 1)
                for b, bi in enumerate(base):
                    for k in range(e):
                        p = kidx[b * e + k]
                        assert 0 <= p < lay.num_pages
                        addr = lay.base + p * lay.page_bytes
                        assert addr == loc.page_address(bi) + k * lay.page_bytes
                        spans.append((addr, addr + lay.page_bytes))
            spans.sort()
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "two buffers' pages overlap"


# -- with torch and CUDA --------------------------------------------------------------------


@pytest.fixture
def cuda_manager():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with KVCacheManager(kv_config(), device="cuda") as m:
        yield m


def test_pool_tensor_is_the_pool_memory(cuda_manager):
    # Writing a page through the tensor is what a batch copy of that page reads back.
    import torch

    import kvcm
    import kvcm.torch as kt

    m = cuda_manager
    prompt = list(range(7, 7 + 3 * TPB))
    stream = torch.cuda.Stream()
    with m.create_kv_cache(input_tokens=prompt) as c:
        assert c.resume(stream)
        c.resize(len(prompt))
        pool = kt.pool_tensor(m, 2, "value", torch.float16, (KV_HEADS, HEAD_DIM))
        assert pool.shape == pool_layout(m, 2, "value", (KV_HEADS, HEAD_DIM), ITEM).shape
        assert pool.data_ptr() == m.get_mem_pool_base_address(2, "value")
        pages = kt.page_indices(m, c, 2, "value")
        assert pages.dtype == torch.int32 and pages.is_cuda
        data = torch.arange(TPB * KV_HEADS * HEAD_DIM, dtype=torch.float16, device="cuda").view(TPB, KV_HEADS, HEAD_DIM)
        with torch.cuda.stream(stream):
            pool[pages[1].long()] = data
        stream.synchronize()
        host = m.alloc_memory(TPB * TOK, kvcm.MemoryKind.HOST_MAPPED)
        ks = m.create_stream()
        ks.batch_copy([(host.ptr, m.get_buffer_location(2, "value").page_address(c.get_base_page_indices(0)[1]),
                        TPB * TOK)])
        ks.synchronize()
        assert host.read() == data.cpu().numpy().tobytes()
        host.close()
        assert torch.equal(pool[pages.long()][1], data)


def test_base_page_indices_view_follows_the_cache(cuda_manager):
    # The CPU view is the cache's own buffer: resize updates it in place.
    import torch

    import kvcm.torch as kt

    m = cuda_manager
    with m.create_kv_cache(input_tokens=list(range(2 * TPB))) as c:
        assert c.resume(kt.current_stream())
        c.resize(2 * TPB)
        view = kt.base_page_indices_view(c, 0)
        assert view.dtype == torch.int32 and view.tolist() == list(c.get_base_page_indices(0))
