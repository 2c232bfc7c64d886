"""Decode attention on the CPU over host KV pages (CPU attention beside the GPU): one query token per
request, for requests whose KV lives in host memory.

Host layout, per layer, for K and V alike (the issue's `[L][block][kv_head][block_size][D]`
indexed at one layer):

    pages[num_pages, num_kv_heads, page_size, head_dim]   bf16 or fp32

Each (page, KV head) tile of page_size x head_dim is contiguous (4 KiB for 16 x 128 bf16),
and in the host tier's page-first pool a page's tiles of all KV heads follow each other. The
page and head strides are free, so K and V may be views of one buffer. Token t of request b
is row t % page_size of page block_tables[b, t // page_size]; positions >= context_lens[b]
are never read. Query head i belongs to KV head i // (Hq // Hkv).

The C++ kernel (csrc/cpu_attention.cpp, built once per source, compiler flags and CPU by
torch.utils.cpp_extension) splits the work into (request, KV-head group, page range) items
over OpenMP threads (by default an item owns every KV head, so it streams whole page spans of
a page-first pool), reads each K/V row once for the whole query-head group, accumulates in
fp32 and merges the splits by log-sum-exp. `CpuAttentionTuning` exposes the split and the
software prefetch for benchmarks/kernels/bench_cpu_attention.py's sweep. Without a compiler, the pure-torch reference below is
used (one warning). Both return the output and the natural-log LSE per (request, head), so a
caller can merge this partial attention with attention over GPU-resident KV:

    lse = logaddexp(lse_a, lse_b);  out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

An empty context (length 0) gives output 0 and LSE -inf, which that merge ignores.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import IntEnum

import torch

from kvtier.kernels.cpu_attention_build import cpu_attention_extension
from kvtier.kernels.launch import check

KV_DTYPES = (torch.bfloat16, torch.float32)
OUT_DTYPES = (torch.bfloat16, torch.float32)
HEAD_DIM_MULTIPLE = 16  # one AVX-512 vector of fp32


class Prefetch(IntEnum):
    """Software prefetch hint of the kernel's tile reads (csrc/cpu_attention.cpp)."""

    NONE = 0
    NTA = 1  # non-temporal: into L1, past the outer levels
    T0 = 2  # into every cache level
    T2 = 3  # into the outer levels only


@dataclass(frozen=True)
class CpuAttentionTuning:
    """How the kernel cuts and reads the work. `heads_per_item`: KV heads one work item owns
    (None: all of them where the problem gives every thread several such items, else one);
    `prefetch_tiles`: how many (page, head) tiles ahead the software prefetch reads; `amx`:
    bf16 pages' scores by AMX tiles where the CPU has them and the OS grants them (else by
    AVX-512 BF16 dot products; the same sums, in another order). Off by default: at the H200
    host's 16 threads the tiles read slower, though one thread computes faster with them
    (results/kernels/cpu_attention_amx_h200_split{0,4,16}_{e508ebf,3381346}.json)."""

    heads_per_item: int | None = None
    # Distance 1 over 2: the faster at 1 x 8192 in nearly every (split, call) pair
    # (cpu_attention_h200_split*_d22b452.json, cpu_attention_amx_h200_split*_*.json).
    prefetch_tiles: int = 1
    prefetch: Prefetch = Prefetch.T0
    amx: bool = False

    def __post_init__(self) -> None:
        if self.heads_per_item is not None and self.heads_per_item < 1:
            raise ValueError(f"heads_per_item must be >= 1, got {self.heads_per_item}")
        if self.prefetch_tiles < 0:
            raise ValueError(f"prefetch_tiles must be >= 0, got {self.prefetch_tiles}")


def _check_inputs(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                  block_tables: torch.Tensor, context_lens: torch.Tensor) -> None:
    for name, t in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages),
                    ("block_tables", block_tables), ("context_lens", context_lens)):
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, not {t.device}")
    check(q.dim() == 3, lambda: f"q must be [B, Hq, D], got {tuple(q.shape)}")
    check(k_pages.dim() == 4 and k_pages.shape == v_pages.shape,
          lambda: f"k_pages and v_pages must both be [num_pages, Hkv, page_size, D], got "
                  f"{tuple(k_pages.shape)} and {tuple(v_pages.shape)}")
    batch, num_heads, head_dim = q.shape
    _, num_kv_heads, page_size, kv_dim = k_pages.shape
    check(kv_dim == head_dim, lambda: f"head_dim of q ({head_dim}) != of the pages ({kv_dim})")
    check(num_heads % num_kv_heads == 0,
          lambda: f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    check(k_pages.dtype in KV_DTYPES and v_pages.dtype == k_pages.dtype,
          lambda: f"pages must both be bf16 or fp32, got {k_pages.dtype} and {v_pages.dtype}")
    for name, t in (("k_pages", k_pages), ("v_pages", v_pages)):
        if t.stride(3) != 1 or t.stride(2) != head_dim:
            raise ValueError(f"{name}: each [page_size, D] tile must be contiguous, "
                             f"strides {t.stride()}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == batch
          and block_tables.dtype == torch.int32 and block_tables.stride(1) == 1,
          lambda: f"block_tables must be [B={batch}, max_pages] int32 with contiguous rows, got "
                  f"{tuple(block_tables.shape)} {block_tables.dtype}")
    check(context_lens.shape == (batch,) and context_lens.dtype == torch.int32,
          lambda: f"context_lens must be [B={batch}] int32, got "
                  f"{tuple(context_lens.shape)} {context_lens.dtype}")
    check(page_size >= 1, "page_size must be at least 1")


def _check_out(out: torch.Tensor, q: torch.Tensor) -> None:
    check(out.shape == q.shape and out.dtype in OUT_DTYPES and out.device.type == "cpu"
          and out.stride(2) == 1,
          lambda: f"out must be a CPU bf16/fp32 tensor of shape {tuple(q.shape)} with contiguous "
                  f"rows, got {tuple(out.shape)} {out.dtype} strides {out.stride()}")


def cpu_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k_pages: torch.Tensor,  # [num_pages, Hkv, page_size, D]
    v_pages: torch.Tensor,  # [num_pages, Hkv, page_size, D]
    block_tables: torch.Tensor,  # [B, max_pages] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,  # [B, Hq, D] bf16 or fp32 (e.g. a pinned staging buffer)
    out_dtype: torch.dtype | None = None,
    num_threads: int | None = None,
    pages_per_split: int | None = None,
    tuning: CpuAttentionTuning = CpuAttentionTuning(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, Hq, D], lse [B, Hq] fp32) of decode attention over host KV pages.

    `scale` defaults to 1/sqrt(D); the output is `out` if given, else a new tensor of
    `out_dtype` (default q's dtype). `num_threads` defaults to torch.get_num_threads();
    `pages_per_split` (default: about four items per thread) sets how finely each request is
    split. Runs the C++ kernel, or the pure-torch reference where it could not be built."""
    _check_inputs(q, k_pages, v_pages, block_tables, context_lens)
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
    threads = torch.get_num_threads() if num_threads is None else num_threads
    check(threads >= 1, lambda: f"num_threads must be >= 1, got {threads}")
    check(pages_per_split is None or pages_per_split >= 1,
          lambda: f"pages_per_split must be >= 1, got {pages_per_split}")
    check(tuning.heads_per_item is None or k_pages.shape[1] % tuning.heads_per_item == 0,
          lambda: f"heads_per_item {tuning.heads_per_item} does not divide {k_pages.shape[1]}")
    if out is None:
        out = torch.empty(q.shape, dtype=out_dtype or q.dtype)
    _check_out(out, q)
    ext = cpu_attention_extension()
    if ext is None or q.shape[2] % HEAD_DIM_MULTIPLE != 0:
        ref_out, lse = cpu_decode_attention_reference(q, k_pages, v_pages, block_tables,
                                                      context_lens, scale)
        out.copy_(ref_out)
        return out, lse
    lse = torch.empty(q.shape[:2], dtype=torch.float32)
    q32, lens = q.to(torch.float32).contiguous(), context_lens.contiguous()  # alive: pointers
    ext.decode_attention(**extension_args(q32, k_pages, v_pages, block_tables, lens, out, lse,
                                          scale, threads, pages_per_split, tuning))
    return out, lse


def extension_args(q32: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                   block_tables: torch.Tensor, context_lens: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, scale: float, threads: int, pages_per_split: int | None,
                   tuning: CpuAttentionTuning) -> dict[str, object]:
    """The C++ entry point's arguments for checked tensors (q32: fp32, contiguous;
    context_lens contiguous): pointers and strides, so the caller keeps the tensors alive
    until the call returns."""
    bt, lens = block_tables, context_lens
    return dict(
        q=q32.data_ptr(), q_stride_b=q32.stride(0), q_stride_h=q32.stride(1),
        k=k_pages.data_ptr(), v=v_pages.data_ptr(), kv_bf16=k_pages.dtype == torch.bfloat16,
        k_stride_page=k_pages.stride(0), k_stride_head=k_pages.stride(1),
        v_stride_page=v_pages.stride(0), v_stride_head=v_pages.stride(1),
        block_table=bt.data_ptr(), bt_stride=bt.stride(0), context_lens=lens.data_ptr(),
        out=out.data_ptr(), out_bf16=out.dtype == torch.bfloat16,
        out_stride_b=out.stride(0), out_stride_h=out.stride(1), lse=lse.data_ptr(),
        batch=q32.shape[0], num_heads=q32.shape[1], num_kv_heads=k_pages.shape[1],
        head_dim=q32.shape[2], page_size=k_pages.shape[2], num_pages=k_pages.shape[0],
        max_pages=bt.shape[1], scale=scale, num_threads=threads,
        pages_per_split=pages_per_split or 0, heads_per_item=tuning.heads_per_item or 0,
        prefetch_tiles=tuning.prefetch_tiles, prefetch_hint=int(tuning.prefetch),
        use_amx=tuning.amx,
    )


def cpu_decode_attention_reference(
    q: torch.Tensor,  # [B, Hq, D]
    k_pages: torch.Tensor,  # [num_pages, Hkv, page_size, D]
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_pages] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle and the fallback: per request, gather its pages, upcast to fp32, softmax
    attention with each KV head repeated over its query-head group. (fp32 output, fp32 lse.)"""
    _check_inputs(q, k_pages, v_pages, block_tables, context_lens)
    batch, num_heads, head_dim = q.shape
    num_pages, num_kv_heads, page_size, _ = k_pages.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out = torch.zeros(batch, num_heads, head_dim, dtype=torch.float32)
    lse = torch.full((batch, num_heads), -math.inf, dtype=torch.float32)
    for b, length in enumerate(context_lens.tolist()):
        if not 0 <= length <= block_tables.shape[1] * page_size:
            raise ValueError(f"context_lens[{b}] = {length} outside "
                             f"[0, {block_tables.shape[1] * page_size}]")
        if length == 0:
            continue
        ids = block_tables[b, : -(-length // page_size)].long()
        if not bool(((ids >= 0) & (ids < num_pages)).all()):
            raise ValueError(f"block_tables[{b}] has ids outside [0, {num_pages}): {ids.tolist()}")
        k = _gather(k_pages, ids, length)  # [Hkv, length, D] fp32
        v = _gather(v_pages, ids, length)
        group = num_heads // num_kv_heads
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # [Hq, length, D]
        scores = torch.einsum("hd,htd->ht", q[b].float(), k) * scale  # [Hq, length]
        lse[b] = torch.logsumexp(scores, dim=-1)
        out[b] = torch.einsum("ht,htd->hd", torch.softmax(scores, dim=-1), v)
    return out, lse


def _gather(pages: torch.Tensor, ids: torch.Tensor, length: int) -> torch.Tensor:
    """[Hkv, length, D] fp32: the request's first `length` rows, page by page."""
    tiles = pages[ids].float()  # [n, Hkv, page_size, D]
    return tiles.permute(1, 0, 2, 3).reshape(pages.shape[1], -1, pages.shape[3])[:, :length]


def _call_in_mode(mode: bool, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode(mode):
        return cpu_decode_attention(*args, **kwargs)


class CpuAttentionWorker:
    """Runs cpu_decode_attention on one worker thread, so the Python main thread stays free
    (the kernel releases the GIL for the whole call) to launch GPU work meanwhile.

    submit() returns a Future at once; calls run one after another in submission order. The
    tensors passed must not be modified until the Future is done."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-attention")

    def submit(self, *args: object, **kwargs: object) -> Future[tuple[torch.Tensor, torch.Tensor]]:
        # Inference mode is per thread: tensors the caller made under it (a step's `out`)
        # take in-place writes only under it, so the call runs in the caller's mode.
        mode = torch.is_inference_mode_enabled()
        return self._pool.submit(_call_in_mode, mode, args, kwargs)

    def close(self) -> None:
        """Waits for the submitted calls, then stops the thread."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> CpuAttentionWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
