"""DirectKV's zero-copy decode attention: the torch reference against a dense softmax, the
Triton kernel against the reference (the interpreter on CPU tensors, compiled on a GPU over
pinned host pages), the LSE contract shared with the CPU attention, and CUDA-graph replay."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from kvtier.kernels.cpu_attention import cpu_decode_attention_reference
from kvtier.kernels.host_decode_attention import (
    HostDecodeLaunch,
    HostDecodeWorkspace,
    choose_num_splits,
    default_num_splits,
    host_decode_attention,
    host_decode_attention_ref,
)
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu


@dataclass
class HostPages:
    q: torch.Tensor  # [B, Hq, D] on DEVICE
    k: torch.Tensor  # [num_pages, Hkv, page_size, D] host (pinned beside a GPU)
    v: torch.Tensor
    block_tables: torch.Tensor  # [B, max_pages] int32 on DEVICE
    context_lens: torch.Tensor  # [B] int32 on DEVICE

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k, self.v, self.block_tables, self.context_lens


def make_pages(lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
               dtype: torch.dtype, page_size: int = 16, seed: int = 0,
               device: torch.device = DEVICE) -> HostPages:
    """Pages owned in shuffled order plus spare pages and a garbage table column; K and V are
    views of one [num_pages, 2, Hkv, page_size, D] buffer (page strides not the dense ones)."""
    gen = torch.Generator().manual_seed(seed)
    per_req = [-(-n // page_size) for n in lens]
    num_pages = sum(per_req) + 3
    kv = torch.randn(num_pages, 2, num_kv_heads, page_size, head_dim, generator=gen).to(dtype)
    if device.type == "cuda":
        kv = kv.pin_memory()
    perm = torch.randperm(num_pages, generator=gen).tolist()
    tables = torch.full((len(lens), max(per_req, default=0) + 1), 10**6, dtype=torch.int32)
    used = 0
    for b, n in enumerate(per_req):
        tables[b, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen).to(dtype)
    return HostPages(q.to(device), kv[:, 0], kv[:, 1], tables.to(device),
                     torch.tensor(lens, dtype=torch.int32, device=device))


def dense_attention(p: HostPages) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token, no paging helpers: softmax over each request's rows, fp32 (CPU)."""
    q, tables, lens = p.q.float().cpu(), p.block_tables.cpu(), p.context_lens.tolist()
    batch, num_heads, head_dim = q.shape
    num_kv_heads, page_size = p.k.shape[1], p.k.shape[2]
    out = torch.zeros(batch, num_heads, head_dim)
    lse = torch.full((batch, num_heads), -math.inf)
    for b, n in enumerate(lens):
        for h in range(num_heads):
            kh = h // (num_heads // num_kv_heads)
            rows = [(int(tables[b, t // page_size]), t % page_size) for t in range(n)]
            if not rows:
                continue
            k = torch.stack([p.k[pg, kh, r].float() for pg, r in rows])
            v = torch.stack([p.v[pg, kh, r].float() for pg, r in rows])
            s = (k @ q[b, h]) / math.sqrt(head_dim)
            lse[b, h] = s.max() + (s - s.max()).exp().sum().log()
            out[b, h] = (s - lse[b, h]).exp() @ v
    return out, lse


def assert_lse(lse: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    lse, ref = lse.float().cpu(), ref.float().cpu()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref))
    finite = torch.isfinite(ref)
    assert torch.isfinite(lse[finite]).all()
    if finite.any():
        assert (lse[finite] - ref[finite]).abs().max() <= tol


LENS = [1, 15, 16, 17, 100, 0, 64, 33]


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (16, 2)])  # G 1, 4, 8
@pytest.mark.parametrize("page_size", [1, 16])
def test_reference_matches_dense_softmax(num_heads, num_kv_heads, page_size):
    p = make_pages(LENS, num_heads, num_kv_heads, 16, torch.float32, page_size,
                   device=torch.device("cpu"))
    out, lse = host_decode_attention_ref(*p.args())
    want, want_lse = dense_attention(p)
    assert torch.allclose(out, want, atol=1e-5)
    assert_lse(lse, want_lse, 1e-5)
    assert (out[LENS.index(0)] == 0).all()
    # The CPU attention's oracle is the same contract.
    cpu_out, cpu_lse = cpu_decode_attention_reference(*p.args())
    assert torch.allclose(out, cpu_out, atol=1e-6) and torch.equal(lse.isinf(), cpu_lse.isinf())


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (16, 2)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_matches_reference_fp32(num_heads, num_kv_heads, page_size, num_splits):
    p = make_pages(LENS, num_heads, num_kv_heads, 16, torch.float32, page_size, seed=1)
    out, lse = host_decode_attention(*p.args(), num_splits=num_splits,
                                     launch=HostDecodeLaunch(block_n=16))
    ref, ref_lse = host_decode_attention_ref(*p.args())
    assert_close(out, ref)
    assert_lse(lse, ref_lse, 1e-5)
    assert (out[LENS.index(0)] == 0).all()


def test_kernel_bf16_pages_and_default_splits():
    """bf16 pages and q (upcast right after the load under the interpreter), an odd head_dim
    (masked lanes), the split count and workspace chosen by the wrapper."""
    p = make_pages([5, 40, 0, 23], 8, 2, 24, torch.bfloat16, page_size=4, seed=2)
    out, lse = host_decode_attention(*p.args(), launch=HostDecodeLaunch(block_n=16))
    ref, ref_lse = host_decode_attention_ref(*p.args())
    assert out.dtype == torch.bfloat16
    assert_close(out, ref.to(torch.bfloat16), torch.bfloat16)
    assert_lse(lse, ref_lse, 2e-2)


def test_given_buffers_are_written_in_place():
    p = make_pages([30, 7], 8, 2, 16, torch.float32, page_size=16, seed=3)
    out = torch.full_like(p.q, float("nan"))
    lse = torch.full(p.q.shape[:2], float("nan"), device=p.q.device)
    ws = HostDecodeWorkspace.allocate(2, 8, 16, 4, p.q.device)
    got_out, got_lse = host_decode_attention(*p.args(), out=out, lse=lse, num_splits=4,
                                             workspace=ws, launch=HostDecodeLaunch(block_n=16))
    assert got_out is out and got_lse is lse
    ref, ref_lse = host_decode_attention_ref(*p.args())
    assert_close(out, ref)
    assert_lse(lse, ref_lse, 1e-5)
    with pytest.raises(ValueError, match="workspace must be"):
        host_decode_attention(*p.args(), num_splits=2, workspace=ws)


def test_lse_merges_host_part_with_gpu_part():
    """Attention over a request's first pages (host) and its last ones (e.g. GPU-resident),
    merged by logaddexp, equals attention over the whole context."""
    whole = make_pages([50, 20], 8, 2, 16, torch.float32, page_size=16, seed=4)
    head = HostPages(whole.q, whole.k, whole.v, whole.block_tables[:, :2].contiguous(),
                     torch.clamp(whole.context_lens, max=32))
    tail_tables = torch.roll(whole.block_tables, -2, dims=1).contiguous()
    tail = HostPages(whole.q, whole.k, whole.v, tail_tables,
                     torch.clamp(whole.context_lens - 32, min=0))
    a = host_decode_attention(*head.args(), num_splits=2, launch=HostDecodeLaunch(block_n=16))
    b = host_decode_attention(*tail.args(), num_splits=1, launch=HostDecodeLaunch(block_n=16))
    lse = torch.logaddexp(a[1], b[1])
    out = (torch.nan_to_num((a[1] - lse).exp())[..., None] * a[0]
           + torch.nan_to_num((b[1] - lse).exp())[..., None] * b[0])
    ref, ref_lse = host_decode_attention_ref(*whole.args())
    assert_close(out, ref)
    assert_lse(lse, ref_lse, 1e-5)


def test_split_heuristic_fills_the_slots():
    # one request, 8 KV heads, 132 SMs x 2 slots: 33 splits, capped by the context's tiles
    assert default_num_splits(1, 8, 8192, 132, 2, 64) == 33
    assert default_num_splits(1, 8, 100, 132, 2, 64) == 2
    assert default_num_splits(64, 8, 131072, 132, 2, 64) == 1
    assert default_num_splits(4, 8, 10**6, 132, 8, 64) == 33
    assert default_num_splits(1, 1, 10**7, 132, 8, 64) == 64
    p = make_pages([10], 8, 2, 16, torch.float32)
    assert 1 <= choose_num_splits(p.q, p.k, p.block_tables.shape[1]) <= 2


def test_bad_input_is_refused():
    p = make_pages([10, 3], 8, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="multiple of"):
        host_decode_attention(p.q[:, :7], *p.args()[1:])
    with pytest.raises(ValueError, match="block_tables must be"):
        host_decode_attention(*p.args()[:3], p.block_tables.long(), p.context_lens)
    with pytest.raises(ValueError, match="context_lens must be"):
        host_decode_attention(*p.args()[:4], p.context_lens[:1])
    with pytest.raises(ValueError, match="lse must be"):
        host_decode_attention(*p.args(), lse=torch.empty(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="num_splits"):
        host_decode_attention(*p.args(), num_splits=65)
    with pytest.raises(ValueError, match="outside"):
        bad = p.block_tables.clone()
        bad[0, 0] = 99
        host_decode_attention_ref(*p.args()[:3], bad, p.context_lens)


@gpu
def test_gpu_refuses_unpinned_and_foreign_pages():
    """Pages are pinned host memory or on q's own GPU (a row's device suffix); pageable
    host pages and pages anywhere else are refused."""
    p = make_pages([10], 8, 2, 128, torch.bfloat16)
    with pytest.raises(ValueError, match="pinned"):
        host_decode_attention(p.q, p.k.clone(), p.v, p.block_tables, p.context_lens)
    with pytest.raises(ValueError, match="host memory or on q's device"):
        host_decode_attention(p.q, p.k.to("meta"), p.v, p.block_tables, p.context_lens)
    out, lse = host_decode_attention(p.q, p.k.cuda(), p.v.cuda(), p.block_tables,
                                     p.context_lens)
    want, want_lse = host_decode_attention_ref(p.q, p.k, p.v, p.block_tables, p.context_lens)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_gpu_llama8b_geometry(dtype, page_size, num_splits):
    """Hq 32, Hkv 8, D 128 over pinned pages, ragged lengths incl. 0 and 1, compiled."""
    lens = [0, 1, 17, 300, 1000, 2049, 64, 515]
    p = make_pages(lens, 32, 8, 128, dtype, page_size, seed=5)
    out, lse = host_decode_attention(*p.args(), num_splits=num_splits)
    torch.cuda.synchronize()
    ref, ref_lse = host_decode_attention_ref(*p.args())
    assert_close(out, ref.to(dtype), dtype)
    assert_lse(lse, ref_lse, 1e-4 if dtype == torch.float32 else 3e-2)


@gpu
def test_gpu_cuda_graph_replays_new_lengths_and_queries():
    """Captured once with out / lse / workspace given: replays see new q, tables and lengths
    (the host pages stay where they are), and equal the reference each time."""
    lens = [700, 33, 0, 1500]
    p = make_pages(lens, 32, 8, 128, torch.bfloat16, seed=6)
    splits = choose_num_splits(p.q, p.k, p.block_tables.shape[1])
    out, lse = torch.empty_like(p.q), torch.empty(4, 32, device="cuda")
    ws = HostDecodeWorkspace.allocate(4, 32, 128, splits, p.q.device)

    def step() -> None:
        host_decode_attention(*p.args(), out=out, lse=lse, num_splits=splits, workspace=ws)

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # Row capacities in pages: 44, 3, 0, 94; rolled by one row: 94, 44, 3, 0.
    for new_lens, roll, seed in (([700, 33, 0, 1500], 0, 7), ([1, 640, 40, 0], 1, 8)):
        p.q.copy_(torch.randn(p.q.shape, generator=torch.Generator().manual_seed(seed)))
        p.context_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        p.block_tables.copy_(torch.roll(p.block_tables, roll, dims=0))
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse = host_decode_attention_ref(*p.args())
        assert_close(out, ref.to(torch.bfloat16), torch.bfloat16)
        assert_lse(lse, ref_lse, 3e-2)
