"""NEO's layer calls (kvtier/kernels/cpu_attention_layers.py): the native job that writes
the rows' new K/V and attends equals the KV write then the wrapper, bit for bit, on both
page dtypes; the Python fallback equals it too; bad slots and block ids raise at the wait
and leave the worker usable; one layer in flight at a time; a closed worker refuses more
work."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.cpu_attention import cpu_decode_attention_reference
from kvtier.kernels.cpu_attention_build import missing_compiler
from kvtier.kernels.cpu_attention_layers import CpuLayerWorker, StepLayers, reference_layer
from tests.kernels.kernel_testing import assert_close

HQ, HKV, D, BS, F_LAYERS, GROUPS = 8, 2, 32, 4, 2, 2
LENS = (9, 1, 14)  # the new token included: row 1 holds only it


@pytest.fixture
def worker():
    if missing_compiler() is not None:
        pytest.skip(missing_compiler())
    w = CpuLayerWorker()
    assert w.native is not None, "the C++ kernel failed to build (see the warning)"
    yield w
    w.close()


def host_rows(dtype: torch.dtype, seed: int = 0):
    """Pages [P, F, 2, Hkv, bs, D] with the rows' blocks shuffled over them (spares too),
    tables [G, n, W], slots [G, n] of each row's last token, lens [n]."""
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-n // BS) for n in LENS)
    num_pages = GROUPS * len(LENS) * width + 3
    pages = torch.randn(num_pages, F_LAYERS, 2, HKV, BS, D, generator=gen).to(dtype)
    ids = torch.randperm(num_pages, generator=gen)[: GROUPS * len(LENS) * width]
    tables = ids.view(GROUPS, len(LENS), width).to(torch.int32).contiguous()
    last = torch.tensor(LENS) - 1
    slots = (tables[:, torch.arange(len(LENS)), last // BS].long() * BS + last % BS).contiguous()
    return pages, tables, slots, torch.tensor(LENS, dtype=torch.int32)


def qkv(dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    n = len(LENS)
    return tuple(torch.randn(n, h, D, generator=gen).to(dtype) for h in (HQ, HKV, HKV))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("native", [True, False])
def test_a_layer_call_is_the_kv_write_then_the_attention(worker, monkeypatch, dtype, native):
    pages, tables, slots, lens = host_rows(dtype)
    expected_pages = pages.clone()
    if not native:
        monkeypatch.setattr(worker, "native", None)  # the fallback: a Python thread
    step = StepLayers(worker, pages, tables, slots, lens, HQ, num_threads=2, pinned=False)
    for layer in range(GROUPS * F_LAYERS):
        group, slot = divmod(layer, F_LAYERS)
        q, k, v = qkv(dtype, seed=layer)
        out, lse = step.submit(group, slot, q, k, v, scale=0.3).result()
        ref, ref_lse = reference_layer(expected_pages, tables, slots, lens, group, slot,
                                       q, k, v, 0.3)
        assert torch.equal(pages, expected_pages)  # the same K/V landed in the same rows
        assert torch.equal(out, ref.to(out.dtype)) and torch.equal(lse, ref_lse)
        layer_pages = pages[:, slot]
        oracle, _ = cpu_decode_attention_reference(q, layer_pages[:, 0], layer_pages[:, 1],
                                                   tables[group], lens, 0.3)
        assert_close(out.float(), oracle, dtype)


def test_the_torch_fallback_writes_a_steps_buffers_made_under_inference_mode(monkeypatch):
    """The runner makes a step's buffers under inference mode, which is per thread: the
    fallback's worker thread writes them (no kernel: the torch reference) in that mode too."""
    import kvtier.kernels.cpu_attention as cpu_attention

    monkeypatch.setattr(cpu_attention, "cpu_attention_extension", lambda: None)
    pages, tables, slots, lens = host_rows(torch.float32)
    expected = pages.clone()
    q, k, v = qkv(torch.float32, seed=0)
    w = CpuLayerWorker()
    w.native = None
    try:
        with torch.inference_mode():
            step = StepLayers(w, pages, tables, slots, lens, HQ, 1, pinned=False)
            out, _ = step.submit(0, 0, q, k, v, scale=0.3).result()
    finally:
        w.close()
    ref, _ = reference_layer(expected, tables, slots, lens, 0, 0, q, k, v, 0.3)
    assert torch.equal(out, ref) and torch.equal(pages, expected)


def test_a_row_without_a_new_token_here_keeps_its_pages(worker):
    pages, tables, slots, lens = host_rows(torch.float32)
    slots[:, 1] = -1
    before = pages.clone()
    step = StepLayers(worker, pages, tables, slots, lens, HQ, num_threads=1, pinned=False)
    q, k, v = qkv(torch.float32, seed=0)
    step.submit(0, 0, q, k, v, scale=0.3).result()
    reference_layer(before, tables, slots, lens, 0, 0, q, k, v, 0.3)
    assert torch.equal(pages, before)


@pytest.mark.parametrize("what", ["slot", "block"])
def test_bad_slots_and_block_ids_raise_at_the_wait_and_the_worker_goes_on(worker, what):
    pages, tables, slots, lens = host_rows(torch.float32)
    bad_tables, bad_slots = tables.clone(), slots.clone()
    if what == "slot":
        bad_slots[0, 2] = pages.shape[0] * BS
    else:
        bad_tables[0, 0, 0] = pages.shape[0]
    q, k, v = qkv(torch.float32, seed=0)
    step = StepLayers(worker, pages, bad_tables, bad_slots, lens, HQ, 1, pinned=False)
    before = pages.clone()
    pending = step.submit(0, 0, q, k, v, scale=0.3)
    with pytest.raises(ValueError, match="outside"):
        pending.result()
    assert torch.equal(pages, before)  # no row written: slots and block ids are checked first
    good = StepLayers(worker, pages, tables, slots, lens, HQ, 1, pinned=False)
    out, _ = good.submit(1, 1, q, k, v, scale=0.3).result()
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="outside"):  # the failed layer's result, asked again
        pending.result()


def test_one_layer_at_a_time(worker):
    pages, tables, slots, lens = host_rows(torch.float32)
    step = StepLayers(worker, pages, tables, slots, lens, HQ, 1, pinned=False)
    q, k, v = qkv(torch.float32, seed=0)
    pending = step.submit(0, 0, q, k, v, scale=0.3)
    with pytest.raises(RuntimeError, match="one layer at a time"):
        step.submit(0, 1, q, k, v, scale=0.3)
    pending.result()
    step.submit(0, 1, q, k, v, scale=0.3).result()


def test_a_q_of_another_dtype_than_the_pages_is_refused(worker):
    pages, tables, slots, lens = host_rows(torch.bfloat16)
    step = StepLayers(worker, pages, tables, slots, lens, HQ, 1, pinned=False)
    q, k, v = qkv(torch.float32, seed=0)
    with pytest.raises(ValueError, match="pages"):
        step.submit(0, 0, q, k, v, scale=0.3)


def test_a_closed_worker_refuses_more_work(worker):
    pages, tables, slots, lens = host_rows(torch.float32)
    step = StepLayers(worker, pages, tables, slots, lens, HQ, 1, pinned=False)
    q, k, v = qkv(torch.float32, seed=0)
    step.submit(0, 0, q, k, v, scale=0.3).result()
    worker.close()
    with pytest.raises(RuntimeError, match="closed"):
        step.submit(0, 1, q, k, v, scale=0.3)
