"""The C++ CPU decode-attention kernel against its pure-torch reference, the LSE it returns,
the forced fallback, bad input, and the worker thread that leaves the main thread free."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

import kvtier.kernels.cpu_attention as cpu_attention
from kvtier.kernels.cpu_attention import (
    CpuAttentionTuning,
    CpuAttentionWorker,
    Prefetch,
    cpu_decode_attention,
    cpu_decode_attention_reference,
)
from kvtier.kernels.cpu_attention_build import (
    CFLAGS,
    build_extension,
    build_key,
    cpu_attention_extension,
    missing_compiler,
)
from tests.kernels.kernel_testing import assert_close


@pytest.fixture(scope="module")
def compiled() -> ModuleType:
    """The kernel, built once per session (and cached on disk across sessions). Without a
    compiler the C++ tests skip; with one, a failing build fails them."""
    reason = missing_compiler()
    if reason is not None:
        pytest.skip(reason)
    ext = cpu_attention_extension()
    assert ext is not None, "the C++ kernel failed to build (see the warning)"
    return ext


@dataclass
class HostKV:
    q: torch.Tensor  # [B, Hq, D] fp32
    k: torch.Tensor  # [num_pages, Hkv, page_size, D]
    v: torch.Tensor
    block_tables: torch.Tensor  # [B, max_pages] int32
    context_lens: torch.Tensor  # [B] int32

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k, self.v, self.block_tables, self.context_lens


def make_host_kv(lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, page_size: int = 16, seed: int = 0) -> HostKV:
    """Random pages owned by the requests in shuffled order (a kernel that ignores the block
    table fails), plus spare pages and an unused table column of garbage ids. K and V are views
    of one [num_pages, 2, Hkv, page_size, D] buffer, so page strides are not the dense ones."""
    gen = torch.Generator().manual_seed(seed)
    per_req = [-(-n // page_size) for n in lens]
    num_pages = sum(per_req) + 3
    kv = torch.randn(num_pages, 2, num_kv_heads, page_size, head_dim, generator=gen).to(dtype)
    perm = torch.randperm(num_pages, generator=gen).tolist()
    tables = torch.full((len(lens), max(per_req, default=0) + 1), 10**6, dtype=torch.int32)
    used = 0
    for b, n in enumerate(per_req):
        tables[b, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen)
    return HostKV(q, kv[:, 0], kv[:, 1], tables, torch.tensor(lens, dtype=torch.int32))


LENS = [1, 15, 16, 17, 100, 333, 0, 64]
GEOMETRIES = [(4, 4, 64), (8, 2, 128), (12, 4, 80), (40, 5, 128)]  # MHA; GQA G = 4, 3, 8


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", GEOMETRIES)
@pytest.mark.parametrize("page_size", [16, 5])
@pytest.mark.parametrize("pages_per_split", [None, 1, 3])
def test_fp32_pages_match_reference(compiled, num_heads, num_kv_heads, head_dim, page_size,
                                    pages_per_split):
    kv = make_host_kv(LENS, num_heads, num_kv_heads, head_dim, torch.float32, page_size)
    out, lse = cpu_decode_attention(*kv.args(), num_threads=3, pages_per_split=pages_per_split)
    ref, ref_lse = cpu_decode_attention_reference(*kv.args())
    assert_close(out, ref)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max() <= 1e-5


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", GEOMETRIES[1:3])
def test_bf16_pages_accumulate_in_fp32(compiled, num_heads, num_kv_heads, head_dim):
    """bf16 storage, fp32 math: an fp32 output is within 1e-5 of the fp32 reference over the
    same bf16 values; a bf16 output adds only its own rounding (2^-8 relative)."""
    kv = make_host_kv(LENS, num_heads, num_kv_heads, head_dim, torch.bfloat16)
    ref, _ = cpu_decode_attention_reference(*kv.args())
    out32, _ = cpu_decode_attention(*kv.args(), out_dtype=torch.float32, pages_per_split=2)
    assert_close(out32, ref, torch.float32)
    q16 = kv.q.to(torch.bfloat16)
    ref16, _ = cpu_decode_attention_reference(q16, *kv.args()[1:])
    out16, _ = cpu_decode_attention(q16, *kv.args()[1:], pages_per_split=2)
    assert out16.dtype == torch.bfloat16
    assert_close(out16, ref16, torch.bfloat16)
    assert (out16.float() - ref16).abs().max() <= 2**-8 * ref16.abs().max()


@pytest.mark.parametrize("head_dim", [64, 128, 80])  # 80: not whole 64-column passes
@pytest.mark.parametrize("page_size", [5, 16, 32, 64])
def test_bf16_pages_of_every_tile_width_keep_the_result(compiled, head_dim, page_size):
    """bf16 V rows in pair order (columns put back on output) and the softmax sums kept
    lane by lane, over tiles narrower than a vector, of one, and of several with padding
    lanes, by one split and by many (their merge sees pair-ordered partials)."""
    kv = make_host_kv(LENS, 8, 2, head_dim, torch.bfloat16, page_size=page_size, seed=9)
    ref, ref_lse = cpu_decode_attention_reference(*kv.args())
    finite = torch.isfinite(ref_lse)
    for split in (None, 1):
        out, lse = cpu_decode_attention(*kv.args(), out_dtype=torch.float32, num_threads=3,
                                        pages_per_split=split)
        assert_close(out, ref, torch.float32)
        assert (lse[finite] - ref_lse[finite]).abs().max() <= 1e-5


def test_many_requests_many_splits_and_threads(compiled):
    lens = torch.randint(1, 300, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    kv = make_host_kv(lens, 32, 8, 128, torch.bfloat16, seed=1)
    ref, ref_lse = cpu_decode_attention_reference(*kv.args())
    for threads in (1, 2, 4):
        out, lse = cpu_decode_attention(*kv.args(), out_dtype=torch.float32, num_threads=threads,
                                        pages_per_split=1)
        assert_close(out, ref)
        assert (lse - ref_lse).abs().max() <= 1e-5


@pytest.mark.parametrize("heads_per_item", [None, 1, 2, 4])
@pytest.mark.parametrize("prefetch,distance", [(Prefetch.NONE, 0), (Prefetch.NTA, 1),
                                               (Prefetch.T0, 2), (Prefetch.T2, 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_work_split_and_prefetch_keep_the_result(compiled, heads_per_item, prefetch, distance,
                                                 dtype):
    """Items of one, some or all KV heads, any prefetch: the same attention. 32-token pages
    hold two 16-row blocks; lengths leave partial blocks and empty contexts."""
    kv = make_host_kv([1, 31, 32, 33, 500, 0, 64], 16, 4, 128, dtype, page_size=32, seed=4)
    ref, ref_lse = cpu_decode_attention_reference(*kv.args())
    tuning = CpuAttentionTuning(heads_per_item=heads_per_item, prefetch=prefetch,
                                prefetch_tiles=distance)
    for split in (None, 1):
        out, lse = cpu_decode_attention(*kv.args(), out_dtype=torch.float32, num_threads=3,
                                        pages_per_split=split, tuning=tuning)
        assert_close(out, ref, torch.float32)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        assert (lse[finite] - ref_lse[finite]).abs().max() <= 1e-5


def test_bf16_query_and_head_dim_64_take_the_row_block_path(compiled):
    """A bf16 q (one bf16 term) and head_dim 64 (the other compiled row-block width)."""
    kv = make_host_kv([16, 48, 7, 130], 8, 2, 64, torch.bfloat16, seed=5)
    q16 = kv.q.to(torch.bfloat16)
    ref, _ = cpu_decode_attention_reference(q16, *kv.args()[1:])
    out, _ = cpu_decode_attention(q16, *kv.args()[1:], out_dtype=torch.float32)
    assert_close(out, ref, torch.float32)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,page_size",
                         [(32, 8, 128, 16), (8, 2, 64, 32), (16, 1, 128, 16), (4, 4, 64, 16),
                          (40, 2, 128, 16)])  # G = 4, 4, 16, MHA, and 20 (past a tile's columns)
def test_amx_tile_scores_match_the_vector_path(compiled, num_heads, num_kv_heads, head_dim,
                                               page_size):
    """Where the CPU has AMX and the OS grants its tiles, bf16 pages' scores come from tile
    products: for an fp32 q (three bf16 terms) and a bf16 q (one), the attention equals the
    reference as the AVX-512 path's does."""
    if not compiled.amx_usable():
        pytest.skip("no AMX tile state on this CPU (the AVX-512 path is the one tested)")
    kv = make_host_kv([1, 15, 16, 17, 100, 333, 0, 64], num_heads, num_kv_heads, head_dim,
                      torch.bfloat16, page_size=page_size, seed=8)
    for q in (kv.q, kv.q.to(torch.bfloat16)):
        ref, ref_lse = cpu_decode_attention_reference(q, *kv.args()[1:])
        finite = torch.isfinite(ref_lse)
        for amx in (True, False):
            out, lse = cpu_decode_attention(q, *kv.args()[1:], out_dtype=torch.float32,
                                            num_threads=3, tuning=CpuAttentionTuning(amx=amx))
            assert_close(out, ref, torch.float32)
            assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
            assert (lse[finite] - ref_lse[finite]).abs().max() <= 1e-5


def test_scratch_reused_across_calls_of_other_sizes(compiled):
    """Per-thread buffers outlive a call: a large problem, a small one, the large one again
    (and a different geometry) each equal their references."""
    big = make_host_kv([700, 300, 900], 32, 8, 128, torch.bfloat16, seed=6)
    small = make_host_kv([20, 3], 4, 1, 64, torch.float32, page_size=5, seed=7)
    for kv in (big, small, big, small):
        out, lse = cpu_decode_attention(*kv.args(), out_dtype=torch.float32, num_threads=2)
        ref, ref_lse = cpu_decode_attention_reference(*kv.args())
        assert_close(out, ref, torch.float32)
        assert (lse - ref_lse).abs().max() <= 1e-5


def test_bad_tuning_is_refused(compiled):
    kv = make_host_kv([40], 8, 4, 64, torch.float32)
    with pytest.raises(ValueError, match="does not divide"):
        cpu_decode_attention(*kv.args(), tuning=CpuAttentionTuning(heads_per_item=3))
    with pytest.raises(ValueError, match="heads_per_item must be >= 1"):
        CpuAttentionTuning(heads_per_item=0)
    with pytest.raises(ValueError, match="prefetch_tiles"):
        CpuAttentionTuning(prefetch_tiles=-1)


def merge(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]):
    """Attention over the union of two disjoint contexts from each one's (out, lse)."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = torch.logaddexp(lse_a, lse_b)
    wa = torch.nan_to_num(torch.exp(lse_a - lse)).unsqueeze(-1)
    wb = torch.nan_to_num(torch.exp(lse_b - lse)).unsqueeze(-1)
    return wa * out_a + wb * out_b, lse


def test_lse_merges_two_halves_into_the_whole(compiled):
    """The two halves of each request's context (cut at a page), attended separately and
    merged by their LSEs, give the whole; an empty half (LSE -inf) merges as nothing."""
    lens = [40, 97, 16, 200]
    kv = make_host_kv(lens, 8, 2, 64, torch.float32)
    cut = [n // 16 // 2 for n in lens]  # pages in the first half (0 for none)
    first_lens = torch.tensor([c * 16 for c in cut], dtype=torch.int32)
    second_tables = torch.zeros_like(kv.block_tables)
    for b, c in enumerate(cut):
        rest = kv.block_tables[b, c:]
        second_tables[b, : rest.numel()] = rest
    whole = cpu_decode_attention(*kv.args(), out_dtype=torch.float32)
    first = cpu_decode_attention(kv.q, kv.k, kv.v, kv.block_tables, first_lens,
                                 out_dtype=torch.float32)
    second = cpu_decode_attention(kv.q, kv.k, kv.v, second_tables,
                                  kv.context_lens - first_lens, out_dtype=torch.float32)
    assert torch.isinf(first[1][2]).all()  # request 2 has a one-page context: empty first half
    out, lse = merge(first, second)
    assert_close(out, whole[0])
    assert (lse - whole[1]).abs().max() <= 1e-5


def test_out_buffer_view_and_default_scale(compiled):
    kv = make_host_kv([33, 7], 8, 2, 64, torch.float32)
    buf = torch.zeros(2, 8, 80)
    view = buf[:, :, 8:72]  # rows of a wider buffer: strides (640, 80, 1)
    out, _ = cpu_decode_attention(*kv.args(), out=view, scale=1 / 8.0)
    assert out.data_ptr() == view.data_ptr()
    assert_close(buf[:, :, 8:72], cpu_decode_attention_reference(*kv.args())[0])
    assert buf[:, :, :8].abs().max() == 0 and buf[:, :, 72:].abs().max() == 0
    other = cpu_decode_attention(*kv.args(), scale=0.5)[0]
    assert_close(other, cpu_decode_attention_reference(*kv.args(), scale=0.5)[0])


@pytest.mark.parametrize("bad_id", [-1, 10**6])
def test_block_id_outside_the_pool_is_refused_before_writing(compiled, bad_id):
    kv = make_host_kv([40, 20], 4, 4, 64, torch.float32)
    kv.block_tables[1, 1] = bad_id
    out = torch.full((2, 4, 64), 7.0)
    with pytest.raises(ValueError, match=r"block_tables\[1, 1\]"):
        cpu_decode_attention(*kv.args(), out=out)
    assert (out == 7.0).all()
    with pytest.raises(ValueError, match=r"block_tables\[1\]"):
        cpu_decode_attention_reference(*kv.args())


def test_bad_shapes_and_lengths_are_refused(compiled):
    kv = make_host_kv([40, 20], 8, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="context_lens"):
        too_long = torch.tensor([40, 10**5], dtype=torch.int32)
        cpu_decode_attention(kv.q, kv.k, kv.v, kv.block_tables, too_long)
    with pytest.raises(ValueError, match="multiple"):
        cpu_decode_attention(kv.q[:, :5], kv.k, kv.v, kv.block_tables, kv.context_lens)
    rows_strided = torch.randn(kv.k.shape[0], 2, 64, 16).transpose(2, 3)  # [P, Hkv, 16, D]
    with pytest.raises(ValueError, match="tile must be contiguous"):
        cpu_decode_attention(kv.q, rows_strided, kv.v, kv.block_tables, kv.context_lens)
    with pytest.raises(ValueError, match="int32"):
        cpu_decode_attention(kv.q, kv.k, kv.v, kv.block_tables.long(), kv.context_lens)
    with pytest.raises(ValueError, match="bf16 or fp32"):
        cpu_decode_attention(kv.q, kv.k.half(), kv.v.half(), kv.block_tables, kv.context_lens)


def test_missing_compiler_falls_back_with_one_log_line(monkeypatch, caplog):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        assert build_extension() is None
    records = [r for r in caplog.records if "CPU decode attention" in r.getMessage()]
    assert len(records) == 1 and "no C++ compiler" in records[0].getMessage()
    monkeypatch.setattr(cpu_attention, "cpu_attention_extension", lambda: None)
    kv = make_host_kv(LENS, 8, 2, 64, torch.float32)
    out, lse = cpu_decode_attention(*kv.args(), out_dtype=torch.bfloat16)
    ref, ref_lse = cpu_decode_attention_reference(*kv.args())
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref.to(torch.bfloat16))
    assert torch.equal(lse, ref_lse)


def test_head_dim_off_the_vector_width_uses_the_reference(compiled):
    kv = make_host_kv([30, 5], 4, 2, 40, torch.float32)
    assert_close(cpu_decode_attention(*kv.args())[0], cpu_decode_attention_reference(*kv.args())[0])


def test_build_key_follows_flags():
    assert build_key(CFLAGS) == build_key(CFLAGS)
    assert build_key(CFLAGS) != build_key((*CFLAGS, "-mno-avx512f"))


@pytest.mark.parametrize("isa,flags", [("avx2", ("-mno-avx512f",)),
                                       ("scalar", ("-mno-avx512f", "-mno-avx2", "-mno-fma"))])
def test_narrower_isa_builds_match_reference(compiled, isa, flags, monkeypatch):
    """The AVX2 and scalar paths, which machines without AVX-512 compile."""
    ext = build_extension((*CFLAGS, *flags))
    assert ext is not None and ext.isa == isa
    monkeypatch.setattr(cpu_attention, "cpu_attention_extension", lambda: ext)
    for dtype in (torch.float32, torch.bfloat16):
        kv = make_host_kv(LENS, 12, 4, 80, dtype, page_size=5)
        out, lse = cpu_decode_attention(*kv.args(), out_dtype=torch.float32, pages_per_split=2)
        ref, ref_lse = cpu_decode_attention_reference(*kv.args())
        assert_close(out, ref, torch.float32)
        finite = torch.isfinite(ref_lse)
        assert (lse[finite] - ref_lse[finite]).abs().max() <= 1e-5


def slow_call(target_s: float) -> HostKV:
    """A problem the kernel takes about `target_s` on one thread for: long contexts over a few
    pages repeated in the block table, so it runs long from L1 with little memory."""
    pages, page_size, heads = 4, 16, 8
    kv = make_host_kv([pages * page_size], heads, 1, 128, torch.float32)
    reps = 256
    while True:
        tables = kv.block_tables[:, :pages].repeat(1, reps).contiguous()
        lens = torch.tensor([reps * pages * page_size], dtype=torch.int32)
        probe = HostKV(kv.q, kv.k, kv.v, tables, lens)
        t0 = time.perf_counter()
        cpu_decode_attention(*probe.args(), num_threads=1)
        if time.perf_counter() - t0 >= target_s or reps >= 1 << 16:
            return probe
        reps *= 2


def test_worker_thread_leaves_the_main_thread_free(compiled):
    """The kernel releases the GIL: while one call runs on the worker, the main thread keeps
    running Python (with the GIL held, it would stall for the whole call)."""
    kv = slow_call(0.2)
    ticks: list[float] = []
    with CpuAttentionWorker() as worker:
        start = time.perf_counter()
        future = worker.submit(*kv.args(), num_threads=1)
        while not future.done():
            ticks.append(time.perf_counter())
            sum(range(200))  # Python work
        out, lse = future.result()
        duration = time.perf_counter() - start
    gaps = [b - a for a, b in zip([start, *ticks], ticks)]
    assert duration >= 0.1, f"the call took {duration:.3f} s, too short to tell"
    assert max(gaps) < duration / 2, f"main thread stalled {max(gaps):.3f} s of {duration:.3f} s"
    assert len(ticks) > 100
    ref, ref_lse = cpu_decode_attention(*kv.args(), num_threads=1)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_build_without_ninja_compiles_directly(compiled, monkeypatch):
    """A machine without ninja still gets the kernel, from one direct compiler call."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    ext = build_extension()
    assert ext is not None and ext.isa == compiled.isa and ext.__name__ != compiled.__name__
    monkeypatch.setattr(cpu_attention, "cpu_attention_extension", lambda: ext)
    kv = make_host_kv(LENS, 8, 2, 64, torch.bfloat16)
    out, _ = cpu_decode_attention(*kv.args(), out_dtype=torch.float32, pages_per_split=2)
    assert_close(out, cpu_decode_attention_reference(*kv.args())[0], torch.float32)
