"""A tiny fake engine for the tests: writes the deterministic writer's bytes
into a cache's pages and reads them back, only through the ABI's stream
helpers (a host-mapped scratch buffer and batch copies on the cache's
stream), the way a real engine's kernels reach device memory."""

from __future__ import annotations

from dataclasses import dataclass

import kvwriter

import kvcm


@dataclass
class Buffer:
    layer: int
    role: str
    size: int  # bytes per block
    tok: int  # bytes per token
    salt: int
    loc: kvcm.BufferLocation


class FakeEngine:
    def __init__(self, manager: kvcm.KVCacheManager, config: kvcm.KVCacheManagerConfig, seed: int,
                 stream: kvcm.Stream | None = None):
        self.m = manager
        self.seed = seed
        self.tpb = config.tokens_per_block
        self.bufs: list[Buffer] = []
        self.states: list[Buffer] = []  # SSM buffers: tok is the whole state
        for layer in sorted(config.layers, key=lambda x: x.layer_id):
            if isinstance(layer, kvcm.SsmLayerConfig):
                for b in layer.buffers:
                    self.states.append(Buffer(layer.layer_id, b.role, b.size, b.size,
                                              kvwriter.buffer_salt(layer.layer_id, b.role),
                                              manager.get_buffer_location(layer.layer_id, b.role)))
                continue
            for b in layer.buffers:
                assert b.size % self.tpb == 0
                self.bufs.append(Buffer(layer.layer_id, b.role, b.size, b.size // self.tpb,
                                        kvwriter.buffer_salt(layer.layer_id, b.role),
                                        manager.get_buffer_location(layer.layer_id, b.role)))
        self.stream = stream if stream is not None else manager.create_stream()
        self.scratch_size = 1 << 16
        self.scratch = manager.alloc_memory(self.scratch_size, kvcm.MemoryKind.HOST_MAPPED)

    def close(self) -> None:
        self.scratch.close()

    def _segments(self, cache: kvcm._KVCache, frm: int, to: int, beam: int = kvcm.DEFAULT_BEAM_INDEX):
        """(pos, buffer, device address) for every position of beam with a page."""
        idx_by_lg: dict[int, object] = {}
        for pos in range(frm, to):
            b = pos // self.tpb
            for buf in self.bufs:
                lg = buf.loc.layer_group
                if lg not in idx_by_lg:
                    idx_by_lg[lg] = cache.get_page_indices(lg, beam)
                idx = idx_by_lg[lg]
                if b >= len(idx) or idx[b] == kvcm.BAD_PAGE_INDEX:
                    continue
                addr = buf.loc.page_address(idx[b]) + (pos % self.tpb) * buf.tok
                yield pos, buf, addr

    def expected(self, tokens, pos: int, buf: Buffer, prefix: list[int]) -> bytes:
        return kvwriter.token_bytes(prefix[pos], pos, buf.salt, buf.tok)

    def _rounds(self, segs):
        run, used = [], 0
        for s in segs:
            if used + s[1].tok > self.scratch_size:
                yield run
                run, used = [], 0
            run.append((s, used))
            used += s[1].tok
        if run:
            yield run

    def _state_seed(self, prefix: list[int], n: int) -> int:
        return prefix[n - 1] if n > 0 else kvwriter.chain_start(self.seed)

    def _state_address(self, cache: kvcm._KVCache, buf: Buffer) -> int:
        slot = cache.get_ssm_block_base_index(buf.loc.layer_group)
        assert slot != kvcm.BAD_PAGE_INDEX, "the cache has no SSM state"
        return buf.loc.page_address(slot)

    def write(self, cache: kvcm._KVCache, tokens, frm: int, to: int, beam: int = kvcm.DEFAULT_BEAM_INDEX) -> int:
        """Write positions [frm, to) of tokens into beam's pages, and with SSM
        layers the state after to positions; returns bytes written."""
        prefix = kvwriter.prefix_hashes(self.seed, tokens[:to])
        stream = cache.cuda_stream or self.stream
        n = 0
        if frm < to and self.states:
            view = self.scratch.view()
            descs, off = [], 0
            for buf in self.states:
                view[off:off + buf.size] = kvwriter.token_bytes(self._state_seed(prefix, to), to, buf.salt, buf.size)
                descs.append((self._state_address(cache, buf), self.scratch.ptr + off, buf.size))
                off += buf.size
                n += buf.size
            del view
            stream.batch_copy(descs)
            stream.synchronize()
        for run in self._rounds(list(self._segments(cache, frm, to, beam))):
            view = self.scratch.view()
            descs = []
            for (pos, buf, addr), off in run:
                view[off:off + buf.tok] = self.expected(tokens, pos, buf, prefix)
                descs.append((addr, self.scratch.ptr + off, buf.tok))
                n += buf.tok
            del view
            stream.batch_copy(descs)
            stream.synchronize()
        return n

    def read(self, cache: kvcm._KVCache, frm: int, to: int, beam: int = kvcm.DEFAULT_BEAM_INDEX):
        """[(pos, buffer, bytes)] of positions [frm, to) of beam that have pages."""
        stream = cache.cuda_stream or self.stream
        out = []
        for run in self._rounds(list(self._segments(cache, frm, to, beam))):
            stream.batch_copy([(self.scratch.ptr + off, addr, buf.tok) for (pos, buf, addr), off in run])
            stream.synchronize()
            for (pos, buf, addr), off in run:
                out.append((pos, buf, self.scratch.read(off, buf.tok)))
        return out

    def verify_state(self, cache: kvcm._KVCache, tokens, n: int) -> str:
        """Read the SSM state back, assert it is the writer's after the first
        n tokens, return the README digest."""
        prefix = kvwriter.prefix_hashes(self.seed, tokens[:n])
        stream = cache.cuda_stream or self.stream
        d = kvwriter.Digest()
        for buf in self.states:
            stream.batch_copy([(self.scratch.ptr, self._state_address(cache, buf), buf.size)])
            stream.synchronize()
            got = self.scratch.read(0, buf.size)
            want = kvwriter.token_bytes(self._state_seed(prefix, n), n, buf.salt, buf.size)
            assert got == want, f"SSM state of layer {buf.layer} role {buf.role} after {n} tokens differs"
            d.update(want)
        return d.hexdigest()

    def verify(self, cache: kvcm._KVCache, tokens, frm: int, to: int, beam: int = kvcm.DEFAULT_BEAM_INDEX) -> str:
        """Read back [frm, to) of beam, assert every byte, return the README digest."""
        prefix = kvwriter.prefix_hashes(self.seed, tokens[:to])
        d = kvwriter.Digest()
        checked = 0
        for pos, buf, got in self.read(cache, frm, to, beam):
            want = self.expected(tokens, pos, buf, prefix)
            assert got == want, (
                f"position {pos} layer {buf.layer} role {buf.role}: got {got.hex()}, want {want.hex()}"
            )
            d.update(got)
            checked += 1
        return d.hexdigest()
