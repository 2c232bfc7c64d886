"""TritonAttentionBackend == TorchAttentionBackend (the oracle) on a mixed batch: decode rows
first, then chunked prefills with a cached prefix and a fresh prompt, every layer of a model
whose KV blocks hold F layers."""

from __future__ import annotations

import pytest
import torch

from kvtier.attention.base import Rope
from kvtier.attention.metadata import AttentionMetadata
from kvtier.attention.torch_backend import TorchAttentionBackend
from kvtier.attention.triton_backend import TritonAttentionBackend
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu, start_loc

NUM_LAYERS = 4
BLOCK_SIZE = 16


def _metadata(query_lens: list[int], seq_lens: list[int], num_groups: int, F: int,
              num_blocks: int, num_decodes: int) -> AttentionMetadata:
    """Random distinct blocks per (group, request); slots for each request's new tokens."""
    R = len(query_lens)
    per_req = [-(-s // BLOCK_SIZE) for s in seq_lens]
    max_blocks = max(per_req)
    tables = torch.full((num_groups, R, max_blocks), 10**6, dtype=torch.int32)
    slots = torch.empty(num_groups, sum(query_lens), dtype=torch.int64)
    for g in range(num_groups):
        perm = torch.randperm(num_blocks).tolist()
        used, t = 0, 0
        for b, (q_len, seq_len) in enumerate(zip(query_lens, seq_lens)):
            tables[g, b, : per_req[b]] = torch.tensor(perm[used : used + per_req[b]])
            used += per_req[b]
            for pos in range(seq_len - q_len, seq_len):
                slots[g, t] = int(tables[g, b, pos // BLOCK_SIZE]) * BLOCK_SIZE + pos % BLOCK_SIZE
                t += 1
    return AttentionMetadata(
        num_tokens=sum(query_lens), num_reqs=R, num_decodes=num_decodes,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_start_loc=start_loc(query_lens),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables.to(DEVICE), slot_mapping=slots.to(DEVICE),
        layers_per_block=F, block_size=BLOCK_SIZE,
        query_lens_cpu=query_lens, seq_lens_cpu=seq_lens,
    )


def _rope(meta: AttentionMetadata, d: int) -> Rope:
    """Each token's absolute position, and a Llama 3 style cos/sin table."""
    positions = [s - q + i for q, s in zip(meta.query_lens_cpu, meta.seq_lens_cpu)
                 for i in range(q)]
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(max(meta.seq_lens_cpu)).float(), inv_freq)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return Rope(torch.tensor(positions, device=DEVICE), cos_sin.to(DEVICE))


def _assert_layer_kv_close(cache: torch.Tensor, ref_cache: torch.Tensor, layer: int,
                           meta: AttentionMetadata) -> None:
    """The layer's new rows within tolerance (rotary rounds differently: TorchOps as HF,
    the kernel once in fp32), every other row of every layer untouched."""
    group, slot = meta.layer_slot(layer)
    written = torch.zeros(cache.shape[0] * BLOCK_SIZE, dtype=torch.bool, device=DEVICE)
    written[meta.slot_mapping[group]] = True
    rows = cache[:, slot].transpose(1, 2).flatten(0, 1)  # [num_blocks * block_size, 2, H, D]
    ref_rows = ref_cache[:, slot].transpose(1, 2).flatten(0, 1)
    assert_close(rows[written], ref_rows[written])
    assert torch.equal(rows[~written], ref_rows[~written])
    others = [s for s in range(cache.shape[1]) if s != slot]
    assert torch.equal(cache[:, others], ref_cache[:, others])


def _check(query_lens: list[int], seq_lens: list[int], num_decodes: int, F: int,
           hq: int, hkv: int, d: int, dtype: torch.dtype, num_layers: int = NUM_LAYERS,
           rotate: bool = False) -> None:
    """rotate: both backends get q and k unrotated with the step's `Rope` (the Triton one
    fuses rotary into its KV write; the oracle rotates with the model's TorchOps)."""
    num_groups = num_layers // F
    num_blocks = sum(-(-s // BLOCK_SIZE) for s in seq_lens) + 2
    meta = _metadata(query_lens, seq_lens, num_groups, F, num_blocks, num_decodes)
    rope = _rope(meta, d) if rotate else None
    # Random cache: the cached prefixes' K/V are whatever is there.
    cache = torch.randn(num_blocks, F, 2, BLOCK_SIZE, hkv, d, device=DEVICE).to(dtype)
    ref_cache = cache.clone()
    torch_be, triton_be = TorchAttentionBackend(), TritonAttentionBackend()
    T = meta.num_tokens
    for layer in range(num_layers):
        q = torch.randn(T, hq, d, device=DEVICE).to(dtype)
        k = torch.randn(T, hkv, d, device=DEVICE).to(dtype)
        v = torch.randn(T, hkv, d, device=DEVICE).to(dtype)
        ref = torch_be.forward(layer, q, k, v, ref_cache, meta, d**-0.5, rope=rope)
        out = triton_be.forward(layer, q, k, v, cache, meta, d**-0.5, rope=rope)
        assert_close(out, ref)
        if rope is None:
            assert torch.equal(cache, ref_cache), f"layer {layer}: caches differ after kv write"
        else:
            _assert_layer_kv_close(cache, ref_cache, layer, meta)
            ref_cache.copy_(cache)  # the next layers attend over the same prefix


@pytest.mark.parametrize("F", [1, 2, NUM_LAYERS])
def test_backend_matches_torch_mixed_batch(F: int) -> None:
    # 3 decodes, a chunk after a 21-token cached prefix, a fresh 18-token prompt, a chunk
    # that ends on a page boundary.
    query_lens = [1, 1, 1, 12, 18, 16]
    seq_lens = [5, 33, 17, 33, 18, 48]
    _check(query_lens, seq_lens, 3, F, 4, 2, 32, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_rotates_q_and_k_when_given_rope(dtype: torch.dtype) -> None:
    query_lens = [1, 1, 12, 18]
    seq_lens = [5, 33, 33, 18]
    _check(query_lens, seq_lens, 2, 2, 4, 2, 32, dtype, rotate=True)


def test_backend_bf16_only_prefills() -> None:
    _check([7, 20], [40, 20], 0, 2, 2, 2, 64, torch.bfloat16)


def test_backend_only_decodes() -> None:
    _check([1, 1], [40, 3], 2, 2, 4, 1, 64, torch.float32)


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@gpu
def test_backend_gpu(dtype: torch.dtype, rotate: bool) -> None:
    query_lens = [1] * 40 + [500, 1000, 37]
    seq_lens = torch.randint(1, 3000, (40,)).tolist() + [2500, 1000, 4000]
    _check(query_lens, seq_lens, 40, 4, 32, 8, 128, dtype, num_layers=8, rotate=rotate)


def test_backend_writes_into_a_given_output_buffer() -> None:
    # The piecewise forward passes its static buffer: the result lands there, every layer,
    # from views the backend derived once for the step.
    query_lens, seq_lens = [1, 1, 12, 18], [5, 33, 33, 18]
    num_blocks = sum(-(-s // BLOCK_SIZE) for s in seq_lens) + 2
    meta = _metadata(query_lens, seq_lens, 2, 2, num_blocks, 2)
    cache = torch.randn(num_blocks, 2, 2, BLOCK_SIZE, 2, 32, device=DEVICE)
    ref_cache = cache.clone()
    T = meta.num_tokens
    buf = torch.zeros(T + 5, 4, 32, device=DEVICE)  # rows past T: a padded buffer's tail
    for layer in range(4):
        q, k, v = (torch.randn(T, h, 32, device=DEVICE) for h in (4, 2, 2))
        ref = TorchAttentionBackend().forward(layer, q, k, v, ref_cache, meta, 32**-0.5)
        out = TritonAttentionBackend().forward(layer, q, k, v, cache, meta, 32**-0.5,
                                               out=buf[:T])
        assert out.data_ptr() == buf.data_ptr()
        assert_close(buf[:T], ref)
    assert "triton" in meta.derived and torch.equal(buf[T:], torch.zeros(5, 4, 32))


def test_a_steps_views_do_not_keep_its_metadata_alive():
    """The backend's per-step views live in the metadata but refer to nothing that refers
    back: a finished step's metadata (and the memory system's rows it names, with their host
    pages) goes with its last reference, not at the collector's next run."""
    import gc
    import weakref

    from kvtier.attention.triton_backend import step_views

    meta = _metadata([1, 1, 5], [9, 17, 5], num_groups=2, F=2, num_blocks=16, num_decodes=2)
    kv = torch.zeros(16, 2, 2, BLOCK_SIZE, 2, 8)
    views = step_views(meta, kv)
    assert views.group(1)[0].shape[0] == 2 and step_views(meta, kv) is views
    alive = weakref.ref(meta)
    gc.disable()
    try:
        del meta, views
        assert alive() is None
    finally:
        gc.enable()
