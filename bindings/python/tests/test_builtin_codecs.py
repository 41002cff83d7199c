"""The built-in codecs from Python: kvcm.codec.Default/Gather/Fp8/Auto and by
name; gather and FP8 are CUDA only, refused on the emulated device."""

from __future__ import annotations

import pytest
from conftest import small_config

import kvcm
from kvcm import CodecRejectedError, ConsumedError, InvalidArgumentError, KVCacheManager
from kvcm.codec import BuiltinCodec, ElementType


@pytest.mark.parametrize("make", [kvcm.codec.Default, kvcm.codec.Auto, lambda: "auto", lambda: "default",
                                  lambda: BuiltinCodec.AUTO])
def test_lossless_builtins_make_a_manager_on_the_emulated_device(make):
    before = kvcm.live_handle_count()
    with KVCacheManager(small_config(host_quota=64 * 1024), cold_page_codec=make(), device="emu") as m:
        assert m.tokens_per_block == 4
    assert kvcm.live_handle_count() == before


@pytest.mark.parametrize("make", [kvcm.codec.Gather, kvcm.codec.Fp8, lambda: "gather", lambda: "FP8",
                                  lambda: BuiltinCodec.GATHER])
def test_kernel_codecs_are_refused_on_the_emulated_device(make):
    before = kvcm.live_handle_count()
    codec = make()
    with pytest.raises(CodecRejectedError, match=r"CUDA device only") as ei:
        KVCacheManager(small_config(host_quota=64 * 1024), cold_page_codec=codec, device="emu")
    assert "emu device" in str(ei.value)
    assert kvcm.live_handle_count() == before  # consumed on the failure path
    if isinstance(codec, kvcm.KVCacheColdPageCodec):
        assert codec.closed
        with pytest.raises(ConsumedError):
            KVCacheManager(small_config(), cold_page_codec=codec, device="emu")


def test_builtin_codec_options_are_checked():
    before = kvcm.live_handle_count()
    with pytest.raises(ValueError, match="kind: expected one of"):
        kvcm.create_builtin_kv_cache_cold_page_codec("zstd")
    with pytest.raises(ValueError, match="kind: expected one of"):
        KVCacheManager(small_config(), cold_page_codec="zstd", device="emu")
    with pytest.raises(TypeError, match="kind"):
        kvcm.create_builtin_kv_cache_cold_page_codec(3.0)
    with pytest.raises(InvalidArgumentError, match=r"options\.block_elems"):
        kvcm.codec.Fp8(block_elems=100)
    with pytest.raises(InvalidArgumentError, match=r"options\.crossover_bytes"):
        kvcm.codec.Auto(crossover_bytes=-1)
    with pytest.raises(ValueError, match="element"):
        kvcm.codec.Fp8("int8")
    with pytest.raises(TypeError, match="block_elems"):
        kvcm.codec.Fp8(block_elems=True)
    assert kvcm.live_handle_count() == before
    # Element types by enum, name, or a dtype's name.
    for element in (ElementType.BFLOAT16, "bf16", "bfloat16", "torch.bfloat16", "float16"):
        kvcm.codec.Fp8(element, block_elems=64).close()
    kvcm.create_builtin_kv_cache_cold_page_codec(BuiltinCodec.GATHER).close()
    assert kvcm.live_handle_count() == before
