"""KVCacheManagerV2's multimodal keys: digest tokens (bytes, MmItemContext)
in prompts, commits and probes; gen_multimodal_cache_key_tokens;
sequence_to_blockchain_keys; through both backends."""

from __future__ import annotations

import hashlib

import pytest
from conftest import CONFORMANCE_DIR, prefill, small_config

from kvcm import (
    KVCacheManager,
    MmItemContext,
    ReuseScope,
    UnsupportedError,
    gen_multimodal_cache_key_tokens,
    sequence_to_blockchain_keys,
)

IMG = hashlib.sha256(b"image-a").digest()
OTHER = hashlib.sha256(b"image-b").digest()
VOCAB = 1000


def image_prompt(digest: bytes, uuid: str | None = None) -> list:
    """Text block, an image item of 4 key tokens, text block."""
    return [1, 2, 3, 4, *gen_multimodal_cache_key_tokens(VOCAB, digest, 4, uuid=uuid), 9, 10, 11, 12]


def test_gen_multimodal_cache_key_tokens():
    """Item-local token 0 is the digest (an MmItemContext with a uuid), the
    others id_offset + their item-local index."""
    assert gen_multimodal_cache_key_tokens(VOCAB, IMG, 3) == [IMG, 1001, 1002]
    assert gen_multimodal_cache_key_tokens(VOCAB, IMG, 3, token_offset=2) == [1002, 1003, 1004]
    (first, second) = gen_multimodal_cache_key_tokens(VOCAB, IMG, 2, uuid="img-1")
    assert first == MmItemContext(IMG, "other-uuid") and first.uuid == "img-1" and second == 1001
    with pytest.raises(ValueError, match="32 bytes"):
        gen_multimodal_cache_key_tokens(VOCAB, b"short", 2)
    with pytest.raises(ValueError, match="num_tokens"):
        gen_multimodal_cache_key_tokens(VOCAB, IMG, 0)
    with pytest.raises(ValueError, match="token_offset"):
        gen_multimodal_cache_key_tokens(VOCAB, IMG, 1, token_offset=-1)


def test_same_item_reuses_and_another_does_not(backend):
    """A prompt with the same item at the same place reuses all of it,
    whether its digest is bytes or an MmItemContext (the uuid never counts);
    another item reuses only the text before it."""
    with KVCacheManager(small_config(), device="emu") as m:
        s = m.create_stream()
        prompt = image_prompt(IMG, uuid="first")
        with m.create_kv_cache(ReuseScope(), prompt) as c:
            c.resume(s)
            prefill(c, prompt)
            assert c.committed_tokens == [1, 2, 3, 4, IMG, 1001, 1002, 1003, 9, 10, 11, 12]
            c.suspend()
        assert m.probe_reuse(ReuseScope(), image_prompt(IMG)) == 12
        assert m.probe_reuse(ReuseScope(), image_prompt(IMG, uuid="second")) == 12
        assert m.probe_reuse(ReuseScope(), image_prompt(OTHER)) == 4
        assert m.probe_reuse(ReuseScope(), [1, 2, 3, 4, 0, 1001, 1002, 1003]) == 4, "token 0 is not the item"
        with m.create_kv_cache(ReuseScope(), image_prompt(IMG)) as c:
            assert c.num_committed_tokens == 12
            assert c.committed_tokens[4] == IMG
        new = m.probe_first_new_block_key(ReuseScope(), image_prompt(OTHER))
        keys = [k for _, k in sequence_to_blockchain_keys(4, ReuseScope(), image_prompt(OTHER))]
        assert new == keys[2], "the first new block: the other item's"


def test_digest_tokens_are_checked(backend):
    with KVCacheManager(small_config(), device="emu") as m:
        with pytest.raises(ValueError, match=r"input_tokens\[2\].*32 bytes"):
            m.create_kv_cache(None, [1, 2, b"short"])
        with pytest.raises(TypeError, match="text-only"):
            m.create_kv_cache(None, image_prompt(IMG), text_only=True)
    with KVCacheManager(small_config(text_only=True), device="emu") as m:
        with pytest.raises(TypeError, match="text-only"):
            m.create_kv_cache(None, image_prompt(IMG))
        with pytest.raises(TypeError, match="text-only"):
            m.probe_reuse(None, image_prompt(IMG))


def test_digest_tokens_with_beam_search_indices_are_unsupported(backend):
    """A beam search step commits text tokens: digest tokens with
    beam_search_indices raise UnsupportedError and commit nothing."""
    with KVCacheManager(small_config(), device="emu") as m:
        with m.create_kv_cache(None, []) as c:
            assert c.resume(m.create_stream()) and c.resize(8)
            with pytest.raises(UnsupportedError, match="beam_search_indices"):
                c.commit([1, IMG], [0])
            assert c.num_committed_tokens == 0
            c.suspend()


def test_sequence_to_blockchain_keys_chains_from_the_scope_root(backend):
    """The root pair, then every block (the partial last one too) with its
    key, chained: the keys a manager's cache events carry."""
    pairs = list(sequence_to_blockchain_keys(4, ReuseScope(), [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert [b for b, _ in pairs] == [[], [1, 2, 3, 4], [5, 6, 7, 8], [9]]
    assert [int.from_bytes(k, "little") for _, k in pairs] == [
        0x46dd8adc732be26c, 0x360d651c5f3d3835, 0x35f5c392fa534ee5, 0xa94949972af05614]
    assert list(sequence_to_blockchain_keys(4, ReuseScope(lora_id=0), []))[0][1] != pairs[0][1]
    with KVCacheManager(small_config(), device="emu", event_queue_capacity=64) as m:
        s = m.create_stream()
        prompt = image_prompt(IMG)
        with m.create_kv_cache(ReuseScope(), prompt) as c:
            c.resume(s)
            prefill(c, prompt)
            c.suspend()
        stored = {e.key for e in m.drain_events() if e.kind.name == "BLOCK_STORED"}
        keys = {int.from_bytes(k, "little") for _, k in list(sequence_to_blockchain_keys(4, ReuseScope(), prompt))[1:]}
        assert keys <= stored


def _parse_blockkeys():
    digests, cases = {}, []
    for no, raw in enumerate((CONFORMANCE_DIR / "blockkeys.keys").read_text().splitlines(), 1):
        f = raw.split("#", 1)[0].split()
        if not f or f[0] == "kvcm-blockkeys":
            continue
        if f[0] == "digest":
            digests[f[1]] = bytes.fromhex(f[2])
            continue
        assert f[0] == "keys", f"line {no}"
        toks_part, keys_part = " ".join(f[6:]).split("=")
        toks = [digests[t[1:]] if t.startswith("@") else int(t) for t in toks_part.split()]
        cases.append(pytest.param(int(f[1]), None if f[2] == "-" else int(f[2]), None if f[3] == "-" else f[3],
                                  f[4] == "partial", toks, [int(k, 16) for k in keys_part.split()], id=f"line{no}"))
    return cases


@pytest.mark.parametrize("tpb, lora, salt, partial, tokens, keys", _parse_blockkeys())
def test_block_key_vectors(backend, tpb, lora, salt, partial, tokens, keys):
    """tests/conformance/blockkeys.keys, through sequence_to_blockchain_keys."""
    pairs = list(sequence_to_blockchain_keys(tpb, _Scope(lora, salt), tokens))
    got = [int.from_bytes(k, "little") for b, k in pairs[1:] if partial or len(b) == tpb]
    assert got == keys


class _Scope:
    """A reuse scope with a str salt (kvcm's salts may be bytes or str; any
    object with lora_id and salt is a scope)."""

    def __init__(self, lora_id, salt):
        self.lora_id, self.salt = lora_id, salt


def test_events_report_digest_tokens_mm_keys_and_no_v1_hash():
    """Stored blocks report a digest token as its hex digest; with
    mm_token_id_offset they list each item run in mm_keys (the digest token
    starts one at offset 0, synthetic tokens continue the chain's item in a
    later block at their item-local offset); a block with a digest and its
    descendants report kvcm's key where a v1 hash cannot be had."""
    from kvcm import KVCacheEventManager, KVCacheStoredData
    from kvcm.events import hash_v1_block_key

    em = KVCacheEventManager(100, hash_algo="auto", mm_token_id_offset=VOCAB)
    # text block, item tokens 0..5 across two blocks, text
    prompt = [1, 2, 3, 4, *gen_multimodal_cache_key_tokens(VOCAB, IMG, 6), 7, 8]
    with KVCacheManager(small_config(), em, device="emu") as m:
        s = m.create_stream()
        with m.create_kv_cache(ReuseScope(), prompt) as c:
            c.resume(s)
            prefill(c, prompt)
            c.suspend()
        em.flush_iteration_events()
        stored = [e for e in em.get_latest_events(timeout_ms=0)
                  if isinstance(e.data, KVCacheStoredData) and e.layer_group_id == 0]
        blocks = [b for e in stored for b in e.data.blocks]
        assert len(blocks) == 3
        assert [t.token_id for t in blocks[1].tokens] == [IMG.hex(), 1001, 1002, 1003]
        assert blocks[0].mm_keys == [] and blocks[1].mm_keys == [(IMG, 0)]
        assert blocks[2].mm_keys == [(IMG, 4)], "the item continues in the next block at local index 4"
        keys = [int.from_bytes(k, "big") for _, k in sequence_to_blockchain_keys(4, ReuseScope(), prompt)][1:]
        assert blocks[0].block_hash == hash_v1_block_key([1, 2, 3, 4], 0)
        assert [b.block_hash for b in blocks[1:]] == keys[1:], \
            "no v1 hash past a digest: the raw key truncated as KVCM2 falls back (its bytes read big-endian)"
    with pytest.raises(ValueError, match="mm_token_id_offset"):
        KVCacheEventManager(10, mm_token_id_offset=-1)


def test_a_restarted_persistent_disk_tier_reuses_digest_keyed_blocks(tmp_path, backend):
    """A persistent disk tier keeps the blocks' digest tokens: the next
    manager on the directory reuses an image prompt's blocks for the same
    item, only the text block before it for another."""
    from kvcm import AttentionLayerConfig, BufferConfig, DiskCacheTierConfig, GpuCacheTierConfig

    def config():
        layers = [AttentionLayerConfig(0, [BufferConfig("key", 64), BufferConfig("value", 64)])]
        tiers = [GpuCacheTierConfig(4 * 128, pool_granularity=0), DiskCacheTierConfig(32 * 128, str(tmp_path), persistent=True)]
        return small_config(tiers=tiers, layers=layers)

    prompt = image_prompt(IMG)
    with KVCacheManager(config(), device="emu") as m:
        s = m.create_stream()
        for p in [prompt] + [list(range(100 * i, 100 * i + 8)) for i in range(1, 5)]:
            with m.create_kv_cache(ReuseScope(), p) as c:  # 4 GPU pages: the image prompt goes to disk
                c.resume(s)
                prefill(c, p)
        s.synchronize()
    with KVCacheManager(config(), device="emu") as m:
        assert m.probe_reuse(ReuseScope(), image_prompt(IMG)) == 12
        assert m.probe_reuse(ReuseScope(), image_prompt(OTHER)) == 4
        with m.create_kv_cache(ReuseScope(), prompt) as c:
            assert c.num_committed_tokens == 12
            assert c.resume(m.create_stream())
            assert c.committed_tokens == [1, 2, 3, 4, IMG, 1001, 1002, 1003, 9, 10, 11, 12]
