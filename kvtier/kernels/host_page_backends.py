"""The two io-backends of the host tier behind one interface (SGLang's io-backend choice,
kernel or direct):

  * KERNEL: one Triton launch moves every listed block through the host pages' UVA
    address, converting the layout (kvtier/kernels/host_page_io.py);
  * DIRECT: the copy engine, one cudaMemcpyAsync per block, or per run of blocks whose
    source and target ids both advance by one (`coalesce_runs`). It copies bytes, so the host
    pages must have the device block's own layout (HostPageLayout.BLOCK). The copies are
    issued through torch (`Tensor.copy_` per piece), through the CUDA runtime directly (one
    call per piece, no dispatcher) or as one cudaMemcpyBatchAsync
    (kvtier/kernels/cuda_memcpy.py): `DirectVia`.

Both take the block lists as host-side ids (the scheduler's plan lives on the host) and
check them there, where it costs no sync: equal lengths, in range, distinct targets (two
copies into one block would leave it to whichever lands last). Work goes on the current
stream; the caller picks the stream and orders it against the forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from kvtier.kernels import cuda_memcpy as cm
from kvtier.kernels import host_page_io as hp
from kvtier.kernels.launch import check, interpreting

Ids = Sequence[int] | torch.Tensor  # host-side block / page ids


class IOBackend(str, Enum):
    KERNEL = "kernel"
    DIRECT = "direct"


class DirectVia(str, Enum):
    """How the DIRECT backend issues its copies."""

    TORCH = "torch"  # Tensor.copy_ per piece
    RUNTIME = "runtime"  # cudaMemcpyAsync per piece, called directly
    BATCH = "batch"  # one cudaMemcpyBatchAsync (CUDA 12.8+; else RUNTIME)


@dataclass(frozen=True)
class PageIOConfig:
    backend: IOBackend = IOBackend.KERNEL
    layout: hp.HostPageLayout = hp.HostPageLayout.HEAD_MAJOR
    num_programs: int = hp.DEFAULT_NUM_PROGRAMS  # KERNEL: programs of 1024 threads
    # KERNEL, loads a step waits for (a hit's blocks): the layers that need them stall
    # until they land, so they take more programs than the copies beside the forward do.
    load_programs: int = hp.DEFAULT_LOAD_PROGRAMS
    tile_bytes: int = hp.DEFAULT_TILE_BYTES  # KERNEL: bytes a program moves per iteration
    coalesce_runs: bool = True  # DIRECT: one copy per run of consecutive blocks
    # DIRECT: how the copies are issued; one batch keeps the copy engine busy on small
    # pages (results/kernels/host_page_io_h200_runtime.json)
    direct_via: DirectVia = DirectVia.BATCH

    def __post_init__(self) -> None:
        if self.backend is IOBackend.DIRECT and self.layout is not hp.HostPageLayout.BLOCK:
            raise ValueError(f"io backend 'direct' copies bytes: it needs host layout "
                             f"'block', not '{self.layout.value}' (use backend 'kernel')")
        if min(self.num_programs, self.load_programs, self.tile_bytes) < 1:
            raise ValueError(f"num_programs, load_programs and tile_bytes must be >= 1, got "
                             f"{self.num_programs}, {self.load_programs}, {self.tile_bytes}")


def runs(dst: Sequence[int], src: Sequence[int]) -> list[tuple[int, int, int]]:
    """(dst start, src start, length) of the maximal runs in which both ids advance by one."""
    out: list[tuple[int, int, int]] = []
    i, n = 0, len(dst)
    while i < n:
        k = 1
        while i + k < n and dst[i + k] == dst[i] + k and src[i + k] == src[i] + k:
            k += 1
        out.append((dst[i], src[i], k))
        i += k
    return out


def copy_pages_direct(dst_pool: torch.Tensor, src_pool: torch.Tensor, dst: Sequence[int],
                      src: Sequence[int], coalesce_runs: bool,
                      via: DirectVia = DirectVia.TORCH) -> None:
    """dst_pool[dst[i]] = src_pool[src[i]] with non-blocking copies of contiguous slices:
    each one cudaMemcpyAsync between pinned host and device memory, on the current stream."""
    pieces = runs(dst, src) if coalesce_runs else [(d, s, 1) for d, s in zip(dst, src)]
    gpu = dst_pool if dst_pool.device.type == "cuda" else src_pool
    if via is DirectVia.TORCH or gpu.device.type != "cuda" or not cm.available():
        for d, s, k in pieces:
            dst_pool[d : d + k].copy_(src_pool[s : s + k], non_blocking=True)
        return
    check(dst_pool.is_contiguous() and src_pool.is_contiguous()
          and dst_pool.shape[1:] == src_pool.shape[1:] and dst_pool.dtype == src_pool.dtype,
          "direct copies need contiguous pools of one block shape and dtype")
    stride = dst_pool[0].numel() * dst_pool.element_size()
    dsts, srcs, sizes = cm.pieces(dst_pool.data_ptr(), src_pool.data_ptr(), stride, pieces)
    stream = torch.cuda.current_stream(gpu.device).cuda_stream
    # The batch call refuses the legacy default stream: there, one call per piece.
    if via is DirectVia.BATCH and cm.has_batch() and stream != 0:
        cm.memcpy_batch(dsts, srcs, sizes, stream, to_host=dst_pool.device.type == "cpu",
                        device_index=gpu.device.index or 0)
    else:
        cm.memcpy_each(dsts, srcs, sizes, stream)


def _as_list(ids: Ids) -> list[int]:
    if isinstance(ids, torch.Tensor):
        check(ids.device.type == "cpu" and ids.dim() == 1 and not ids.is_floating_point(),
              lambda: f"ids: a 1-D integer CPU tensor, got {ids.dtype} {tuple(ids.shape)} "
                      f"on {ids.device}")
        return ids.tolist()
    return [int(i) for i in ids]


def _checked(src: Ids, dst: Ids, num_src: int, num_dst: int) -> tuple[list[int], list[int]]:
    s, d = _as_list(src), _as_list(dst)
    check(len(s) == len(d), lambda: f"{len(s)} source ids vs {len(d)} target ids")
    for name, ids, n in (("source", s, num_src), ("target", d, num_dst)):
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"{name} ids out of range [0, {n}): {bad[:8]}")
    check(len(set(d)) == len(d), "target ids repeat: each block or page may be written once")
    return s, d


class HostPageIO:
    """Stores device blocks into host pages (D2H) and loads them back (H2D) with the
    configured backend. On a CPU device without the Triton interpreter, KERNEL runs the
    torch reference (the CPU path)."""

    def __init__(self, config: PageIOConfig = PageIOConfig()):
        self.config = config

    def store(self, gpu_kv: torch.Tensor, host_kv: torch.Tensor, gpu_blocks: Ids,
              host_pages: Ids) -> None:
        """host page host_pages[i] = device block gpu_blocks[i]."""
        src, dst = _checked(gpu_blocks, host_pages, gpu_kv.shape[0], host_kv.shape[0])
        self._move(gpu_kv, host_kv, src, dst, to_host=True)

    def load(self, host_kv: torch.Tensor, gpu_kv: torch.Tensor, host_pages: Ids,
             gpu_blocks: Ids, awaited: bool = False) -> None:
        """device block gpu_blocks[i] = host page host_pages[i]. `awaited`: the step's
        layers wait for these blocks (KERNEL launches `load_programs` programs)."""
        src, dst = _checked(host_pages, gpu_blocks, host_kv.shape[0], gpu_kv.shape[0])
        self._move(gpu_kv, host_kv, src, dst, to_host=False, awaited=awaited)

    def _move(self, gpu_kv: torch.Tensor, host_kv: torch.Tensor, src: list[int],
              dst: list[int], to_host: bool, awaited: bool = False) -> None:
        c = self.config
        hp.check_pools(gpu_kv, host_kv, c.layout)
        if not src:
            return
        if c.backend is IOBackend.DIRECT:
            check(gpu_kv.is_contiguous() and host_kv.is_contiguous(),
                  "io backend 'direct': both pools must be contiguous (one copy per slice)")
            a, b = (host_kv, gpu_kv) if to_host else (gpu_kv, host_kv)
            copy_pages_direct(a, b, dst, src, c.coalesce_runs, c.direct_via)
            return
        if gpu_kv.device.type == "cpu" and not interpreting():
            ref = hp.gather_to_host_ref if to_host else hp.scatter_to_gpu_ref
            ref(*((gpu_kv, host_kv) if to_host else (host_kv, gpu_kv)),
                torch.tensor(src), torch.tensor(dst), c.layout)
            return
        # The ids ride to the device beside the copy: a few bytes a block.
        ids = torch.tensor([src, dst], dtype=torch.int64).to(gpu_kv.device, non_blocking=True)
        kernel = hp.gather_to_host if to_host else hp.scatter_to_gpu
        kernel(*((gpu_kv, host_kv) if to_host else (host_kv, gpu_kv)), ids[0], ids[1],
               c.layout, c.load_programs if awaited else c.num_programs, c.tile_bytes)
