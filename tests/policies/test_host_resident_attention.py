"""The attention backends' external-rows hook (kvtier/attention/base.py, ExternalRows): the
leading decode rows are handed to the memory system once per layer, with q/k/v as the
backend got them (and `rope` when it has not rotated them yet); the backend writes no KV for
them and attends only for the other rows, whose outputs equal a run without the hook."""

from __future__ import annotations

import pytest
import torch

from kvtier.attention.base import Rope
from kvtier.attention.metadata import AttentionMetadata
from kvtier.attention.torch_backend import TorchAttentionBackend
from kvtier.model.loader import resolve_model_config
from kvtier.model.rope import cos_sin_cache

BS, HKV, HQ, D = 4, 2, 4, 16
# rows: 0 and 1 decode (contexts 6 and 5), 2 a prefill of 3 tokens after 2 cached ones
SEQ_LENS, Q_LENS = [6, 5, 5], [1, 1, 3]
TABLES = [[0, 1, 0], [2, 3, 0], [4, 5, 0]]


def meta(slots: list[int]) -> AttentionMetadata:
    return AttentionMetadata(
        num_tokens=5, num_reqs=3, num_decodes=2, max_query_len=3, max_seq_len=6,
        query_start_loc=torch.tensor([0, 1, 2, 5], dtype=torch.int32),
        seq_lens=torch.tensor(SEQ_LENS, dtype=torch.int32),
        block_tables=torch.tensor([TABLES], dtype=torch.int32),
        slot_mapping=torch.tensor([slots], dtype=torch.int64), layers_per_block=1,
        block_size=BS, query_lens_cpu=Q_LENS, seq_lens_cpu=SEQ_LENS)


SLOTS = [0 * BS + 1 + BS, 3 * BS + 0, 4 * BS + 2, 4 * BS + 3, 5 * BS + 0]  # row 0 at pos 5


class Recorder:
    num_rows = 1

    def __init__(self):
        self.calls: list[tuple[int, bool]] = []

    def forward(self, layer_idx, q, k, v, scale, out, rope):
        self.calls.append((layer_idx, rope is not None))
        out[:1] = 7.0  # the system's answer for its row

    def join(self, layer_idx):
        self.calls.append((layer_idx, "join"))


def backends():
    out = [pytest.param(TorchAttentionBackend(), id="torch")]
    from kvtier.attention.triton_backend import TritonAttentionBackend

    out.append(pytest.param(TritonAttentionBackend(), id="triton"))
    return out


@pytest.mark.parametrize("backend", backends())
def test_external_rows_are_the_systems_and_the_rest_are_unchanged(backend):
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(6, 1, 2, BS, HKV, D, generator=g)
    q, k, v = (torch.randn(5, h, D, generator=g) for h in (HQ, HKV, HKV))
    mc, _ = resolve_model_config("tiny-llama", "dummy")
    rope = Rope(torch.tensor([5, 4, 2, 3, 4]), cos_sin_cache(mc, 64, torch.device("cpu"))[:, :D])
    plain_cache = cache.clone()
    plain = backend.forward(0, q, k, v, plain_cache, meta(SLOTS), D ** -0.5, rope=rope)
    m = meta([-1, *SLOTS[1:]])  # the runner gives the external row no slot
    m.external = ext = Recorder()
    hooked_cache = cache.clone()
    hooked = backend.forward(0, q, k, v, hooked_cache, m, D ** -0.5, rope=rope)
    # rope handed over only if not applied; joined once the backend's own rows are done
    assert ext.calls == [(0, backend.fuses_rotary), (0, "join")]
    assert torch.equal(hooked[:1], torch.full_like(hooked[:1], 7.0))
    torch.testing.assert_close(hooked[1:], plain[1:])
    block, off = divmod(SLOTS[0], BS)
    assert torch.equal(hooked_cache[block, 0, :, off], cache[block, 0, :, off])  # not written
    assert not torch.equal(plain_cache[block, 0, :, off], cache[block, 0, :, off])
    others = torch.ones(6, BS, dtype=torch.bool)
    others[block, off] = False
    torch.testing.assert_close(hooked_cache[:, 0].permute(0, 2, 1, 3, 4)[others],
                               plain_cache[:, 0].permute(0, 2, 1, 3, 4)[others])
