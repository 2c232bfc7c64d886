"""Move KV blocks between the device pool and pages of a pinned host pool with a Triton
kernel that reads or writes the host pages through their UVA pointer (GPU-assisted I/O,
as in SGLang's host-memory cache), converting the layout on the way.

Device pool (the engine's): [num_blocks, F, 2, block_size, Hkv, D].
Host pool, one page per device block, page-first (a page is one contiguous span, so a
whole block moves as one run of host addresses), in one of two layouts:
  * HEAD_MAJOR [num_pages, F, 2, Hkv, block_size, D] (the default): each (layer, K/V, head)
    of a page is one contiguous [block_size, D] tile, what a reader on the host wants
    (CPU attention, or a zero-copy GPU read, per KV head) and what a later load reads back
    whole.
  * BLOCK [num_pages, F, 2, block_size, Hkv, D]: byte for byte the device block, the only
    layout the copy engine can move (one cudaMemcpyAsync per block or run of blocks,
    kvtier/kernels/host_page_backends.py).
Against SGLang's host-cache memory layouts: both are page-first; within a page BLOCK has the
order of its `page_first_direct` (layers, tokens, heads; K/V kept inside the page here, so a
page is one span), HEAD_MAJOR puts heads outside tokens.

Why a kernel: a few programs of 1024 threads keep enough 16 B loads in flight to fill PCIe
with pages far smaller than a copy-engine call needs, and leave the other SMs to a
concurrent forward; the program count is a launch argument (the benchmark sweeps it,
benchmarks/kernels/bench_host_page_io.py).

How the host pointer gets to the kernel: a pinned CPU tensor is passed as is. Triton's
launcher asks the driver for the device address of every pointer argument
(cuPointerGetAttribute), which for page-locked memory under UVA is a valid device address.
Launch with the device pool's device current, as every kernel here.

The work is a flat list of rows (one row = D contiguous elements in both layouts), in the
host page's order so that consecutive lanes touch consecutive host addresses; each program
strides over tiles of rows.
"""

from __future__ import annotations

from enum import Enum

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import (
    check,
    check_last_dim_contiguous,
    interpreting,
    next_pow2,
    upcast,
)
from kvtier.kernels.ptx import global_ns

NUM_WARPS = 32  # 1024 threads a program, the shape the published I/O kernels use
# Two programs move 16-token pages within 1.3 % of four's rate alone, both ways, and slow a
# concurrent stand-in 8K prefill far less when storing (D2H +12.4 % against +42.5 %; H2D
# +4.5 % against +5.1 %): results/kernels/host_page_io_h200_runtime.json.
DEFAULT_NUM_PROGRAMS = 2
# Loads the step's layers wait for: nothing runs beside them that they could slow more than
# the wait itself costs (measured: results/policies/strata_leval_load_programs_h200.json).
DEFAULT_LOAD_PROGRAMS = 8
DEFAULT_TILE_BYTES = 64 * 1024  # bytes one program moves per loop iteration
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Cache hints of the copy's loads and stores (see the kernel); a CPU test compiles the kernel
# for sm_90 with Triton's ptxas, which checks that the pair is one PTX accepts.
LOAD_EVICTION_POLICY: tl.constexpr = tl.constexpr("evict_first")
STORE_CACHE_MODIFIER: tl.constexpr = tl.constexpr(".cs")  # streaming: written once


class HostPageLayout(str, Enum):
    HEAD_MAJOR = "head_major"  # page [F, 2, Hkv, block_size, D]
    BLOCK = "block"  # page [F, 2, block_size, Hkv, D], the device block as is


def host_page_shape(block_shape: tuple[int, ...], layout: HostPageLayout) -> tuple[int, ...]:
    """One host page's shape for a device block of shape [F, 2, block_size, Hkv, D]."""
    f, two, bs, h, d = block_shape
    return (f, two, h, bs, d) if layout is HostPageLayout.HEAD_MAJOR else (f, two, bs, h, d)


def block_order(host_kv: torch.Tensor, layout: HostPageLayout) -> torch.Tensor:
    """The host pool seen in the device block's dim order, [P, F, 2, block_size, Hkv, D] (a
    view: writes go to the pool)."""
    return host_kv.transpose(3, 4) if layout is HostPageLayout.HEAD_MAJOR else host_kv


def host_order(pool: torch.Tensor, layout: HostPageLayout) -> torch.Tensor:
    """A pool in block order seen in the host page's dim order (a view)."""
    return pool.transpose(3, 4) if layout is HostPageLayout.HEAD_MAJOR else pool


@triton.jit
def _tile_ids(src_ids_ptr, dst_ids_ptr, row, num_rows, ROWS_PER_PAGE: tl.constexpr):
    """Each row's (source, target) page id, int64 for the address arithmetic."""
    ok = row < num_rows
    i = row // ROWS_PER_PAGE
    src = tl.load(src_ids_ptr + i, mask=ok, other=0).to(tl.int64)
    dst = tl.load(dst_ids_ptr + i, mask=ok, other=0).to(tl.int64)
    return src, dst


@triton.jit
def _wait_until(deadline):
    now = global_ns()
    while now < deadline:
        now = global_ns()


@triton.jit
def _copy_rows_kernel(
    src_ptr, src_ids_ptr, s_page, s_f, s_kv, s_r1, s_r2,  # [*, F, 2, R1, R2, D] view
    dst_ptr, dst_ids_ptr, d_page, d_f, d_kv, d_r1, d_r2,  # same dims, other pool
    num_rows,  # len(ids) * ROWS_PER_PAGE
    ns_per_tile,  # > 0: a program starts its k-th tile no sooner than k x this after its first
    R1: tl.constexpr, R2: tl.constexpr, ROWS_PER_PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, TILE_ROWS: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * TILE_ROWS
    rows = tl.arange(0, TILE_ROWS)
    d = tl.arange(0, D_PAD)
    src_id, dst_id = _tile_ids(src_ids_ptr, dst_ids_ptr, pid * TILE_ROWS + rows, num_rows,
                               ROWS_PER_PAGE)
    t0 = tl.full((), 0, tl.int64)
    if ns_per_tile > 0:
        t0 = global_ns()
    for start in tl.range(pid * TILE_ROWS, num_rows, step):
        if ns_per_tile > 0:  # paced: see `paced_gbps` in _launch
            _wait_until(t0 + ((start - pid * TILE_ROWS) // step).to(tl.int64) * ns_per_tile)
        row = start + rows
        row_ok = row < num_rows
        r = row % ROWS_PER_PAGE  # row within the page, host order: (f, kv, r1, r2)
        r2 = r % R2
        r1 = (r // R2) % R1
        kv = (r // (R1 * R2)) % 2
        f = r // (2 * R1 * R2)
        src_row = src_id * s_page + f * s_f + kv * s_kv + r1 * s_r1 + r2 * s_r2
        dst_row = dst_id * d_page + f * d_f + kv * d_kv + r1 * d_r1 + r2 * d_r2
        if D_PAD == HEAD_DIM:  # a row-only mask keeps each lane's 16 B access one vector
            mask = row_ok[:, None]
        else:
            mask = row_ok[:, None] & (d < HEAD_DIM)[None, :]
        # Read once, never again soon: go first out of L1 and L2, which a forward running
        # beside the copy wants for itself. An eviction priority alone: PTX's ld takes either
        # a cache operator (.cg, ...) or an eviction priority, never both (ptxas refuses
        # `.cg` with `.evict_first`), and Triton's loads have no streaming `.cs`.
        x = tl.load(src_ptr + src_row[:, None] + d[None, :], mask=mask,
                    eviction_policy=LOAD_EVICTION_POLICY)
        # The next tile's ids, fetched while this tile's data is in flight (over PCIe, the
        # longer wait), so the next iteration's loads need not wait for them.
        src_id, dst_id = _tile_ids(src_ids_ptr, dst_ids_ptr, row + step, num_rows,
                                   ROWS_PER_PAGE)
        if UPCAST:  # the interpreter's bf16 (exact both ways)
            x = x.to(tl.float32)
        tl.store(dst_ptr + dst_row[:, None] + d[None, :], x.to(dst_ptr.dtype.element_ty),
                 mask=mask, cache_modifier=STORE_CACHE_MODIFIER)


def check_pools(gpu_kv: torch.Tensor, host_kv: torch.Tensor, layout: HostPageLayout,
                need_pinned: bool = True) -> None:
    """Shapes, dtypes and devices of a pair of pools; beside a CUDA pool the host pool must
    be pinned (`need_pinned`) for the kernel and the copy engine, not for the references."""
    check(gpu_kv.dim() == 6 and gpu_kv.shape[2] == 2,
          lambda: f"gpu_kv: [num_blocks, F, 2, block_size, Hkv, D], got {tuple(gpu_kv.shape)}")
    want = host_page_shape(tuple(gpu_kv.shape[1:]), layout)
    check(host_kv.dim() == 6 and tuple(host_kv.shape[1:]) == want,
          lambda: f"host_kv: pages of {want} ({layout.value}), got {tuple(host_kv.shape)}")
    check(host_kv.dtype == gpu_kv.dtype, lambda: f"dtypes differ: {host_kv.dtype} vs {gpu_kv.dtype}")
    check(gpu_kv.dtype in _DTYPES, lambda: f"dtype {gpu_kv.dtype} not one of {_DTYPES}")
    check(host_kv.device.type == "cpu", lambda: f"host_kv must be a CPU tensor, is on {host_kv.device}")
    if need_pinned and gpu_kv.device.type == "cuda":
        check(host_kv.is_pinned(), "host_kv must be pinned (pin_memory=True): the kernel "
                                   "reaches it through its UVA address")
    for name, t in (("gpu_kv", gpu_kv), ("host_kv", host_kv)):
        check_last_dim_contiguous(name, t)


def _check_ids(src: torch.Tensor, dst: torch.Tensor, device: torch.device) -> None:
    for name, t in (("src ids", src), ("dst ids", dst)):
        if not (t.dim() == 1 and t.dtype in (torch.int32, torch.int64) and t.is_contiguous()):
            raise ValueError(f"{name}: contiguous 1-D int32/int64, got {t.dtype} {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} on {t.device}, the kernel reads them on {device}")
    check(src.shape == dst.shape, lambda: f"{src.shape[0]} src ids vs {dst.shape[0]} dst ids")


def _launch(src: torch.Tensor, src_ids: torch.Tensor, dst: torch.Tensor, dst_ids: torch.Tensor,
            num_programs: int, tile_bytes: int, num_warps: int = NUM_WARPS,
            paced_gbps: float | None = None) -> None:
    """src and dst: [*, F, 2, R1, R2, D] views in host-page order. `paced_gbps`: the programs
    together issue tiles no faster than this (each spins on the GPU's timer before a tile
    that would run ahead), so a copy does not queue more over PCIe than the link drains;
    under the interpreter, which has no timer, the copy runs unpaced (pacing is timing
    only: the bytes moved are the same)."""
    check(num_programs >= 1, lambda: f"num_programs must be >= 1, got {num_programs}")
    check(paced_gbps is None or paced_gbps > 0,
          lambda: f"paced_gbps must be > 0, got {paced_gbps}")
    check(num_warps in (1, 2, 4, 8, 16, 32),
          lambda: f"num_warps must be a power of 2 up to 32, got {num_warps}")
    n = src_ids.shape[0]
    if n == 0:
        return
    _, f, two, r1, r2, d = src.shape
    rows_per_page = f * two * r1 * r2
    d_pad = next_pow2(d)
    fit = max(1, tile_bytes // (d_pad * src.element_size()))
    tile_rows = min(1 << (fit.bit_length() - 1), next_pow2(n * rows_per_page))  # a power of 2
    num_tiles = -(-n * rows_per_page // tile_rows)
    programs = min(num_programs, num_tiles)
    check((num_tiles + programs) * tile_rows < 2**31,  # row indices are int32
          lambda: f"{n} pages of {rows_per_page} rows: too many for one launch")
    ns_per_tile = 0
    if paced_gbps is not None and not interpreting():  # bytes / (GB/s) = ns
        ns_per_tile = max(1, round(tile_rows * d * src.element_size() * programs / paced_gbps))
    _copy_rows_kernel[(programs,)](
        src, src_ids, *src.stride()[:5], dst, dst_ids, *dst.stride()[:5], n * rows_per_page,
        ns_per_tile, R1=r1, R2=r2, ROWS_PER_PAGE=rows_per_page, HEAD_DIM=d, D_PAD=d_pad,
        TILE_ROWS=tile_rows, UPCAST=upcast(src.dtype), num_warps=num_warps,
    )


def gather_to_host(
    gpu_kv: torch.Tensor,  # [num_blocks, F, 2, block_size, Hkv, D] (device)
    host_kv: torch.Tensor,  # [num_pages, *host_page_shape] (pinned)
    gpu_blocks: torch.Tensor,  # [n] int, on gpu_kv's device
    host_pages: torch.Tensor,  # [n] int, on gpu_kv's device; distinct
    layout: HostPageLayout = HostPageLayout.HEAD_MAJOR,
    num_programs: int = DEFAULT_NUM_PROGRAMS, tile_bytes: int = DEFAULT_TILE_BYTES,
    *, num_warps: int = NUM_WARPS, paced_gbps: float | None = None,
) -> None:
    """D2H, one launch: host page host_pages[i] = device block gpu_blocks[i], on the current
    stream. Ids are not range-checked here (that would cost a sync): HostPageIO checks them
    on the host."""
    check_pools(gpu_kv, host_kv, layout)
    _check_ids(gpu_blocks, host_pages, gpu_kv.device)
    _launch(host_order(gpu_kv, layout), gpu_blocks, host_kv, host_pages, num_programs, tile_bytes,
            num_warps, paced_gbps)


def scatter_to_gpu(
    host_kv: torch.Tensor,  # [num_pages, *host_page_shape] (pinned)
    gpu_kv: torch.Tensor,  # [num_blocks, F, 2, block_size, Hkv, D] (device)
    host_pages: torch.Tensor,  # [n] int, on gpu_kv's device
    gpu_blocks: torch.Tensor,  # [n] int, on gpu_kv's device; distinct
    layout: HostPageLayout = HostPageLayout.HEAD_MAJOR,
    num_programs: int = DEFAULT_NUM_PROGRAMS, tile_bytes: int = DEFAULT_TILE_BYTES,
    *, num_warps: int = NUM_WARPS, paced_gbps: float | None = None,
) -> None:
    """H2D, one launch: device block gpu_blocks[i] = host page host_pages[i]."""
    check_pools(gpu_kv, host_kv, layout)
    _check_ids(host_pages, gpu_blocks, gpu_kv.device)
    _launch(host_kv, host_pages, host_order(gpu_kv, layout), gpu_blocks, num_programs, tile_bytes,
            num_warps, paced_gbps)


def gather_to_host_ref(gpu_kv: torch.Tensor, host_kv: torch.Tensor, gpu_blocks: torch.Tensor,
                       host_pages: torch.Tensor,
                       layout: HostPageLayout = HostPageLayout.HEAD_MAJOR) -> None:
    """Pure torch: the CPU path and the oracle."""
    check_pools(gpu_kv, host_kv, layout, need_pinned=False)
    blocks = gpu_kv.index_select(0, gpu_blocks.to(gpu_kv.device, torch.int64))
    block_order(host_kv, layout).index_copy_(0, host_pages.to("cpu", torch.int64), blocks.cpu())


def scatter_to_gpu_ref(host_kv: torch.Tensor, gpu_kv: torch.Tensor, host_pages: torch.Tensor,
                       gpu_blocks: torch.Tensor,
                       layout: HostPageLayout = HostPageLayout.HEAD_MAJOR) -> None:
    """Pure torch: the CPU path and the oracle."""
    check_pools(gpu_kv, host_kv, layout, need_pinned=False)
    pages = block_order(host_kv, layout).index_select(0, host_pages.to("cpu", torch.int64))
    gpu_kv.index_copy_(0, gpu_blocks.to(gpu_kv.device, torch.int64), pages.to(gpu_kv.device))
