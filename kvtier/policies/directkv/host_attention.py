"""Decode attention of GPU queries over KV pages in pinned host memory, through the
zero-copy kernel `kvtier.kernels.host_decode_attention` where that module exists (same
contract as `cpu_decode_attention`: q and out on the GPU, pages on the host), else through
torch math on the CPU over the same pages (the reference path: exact, not fast)."""

from __future__ import annotations

import functools
import importlib
import logging
import math
from collections.abc import Callable

import torch

from kvtier.kernels.cpu_attention import cpu_decode_attention_reference

log = logging.getLogger("kvtier")
KERNEL_MODULE = "kvtier.kernels.host_decode_attention"


@functools.cache
def _kernel() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    try:
        module = importlib.import_module(KERNEL_MODULE)
    except ModuleNotFoundError as e:
        if e.name != KERNEL_MODULE:
            raise
        log.info("%s is absent: host-resident attention runs the torch reference", KERNEL_MODULE)
        return None
    return module.host_decode_attention


def host_attention(
    q: torch.Tensor,  # [B, Hq, D] (device)
    k_pages: torch.Tensor,  # [num_pages, Hkv, page_size, D] (pinned host)
    v_pages: torch.Tensor,  # [num_pages, Hkv, page_size, D]
    block_tables: torch.Tensor,  # [B, max_pages] int32 (on q's device)
    context_lens: torch.Tensor,  # [B] int32 (on q's device)
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, Hq, D], lse [B, Hq] fp32), both on q's device."""
    kernel = _kernel_for(q, scale)
    if kernel is not None:
        return kernel(q, k_pages, v_pages, block_tables, context_lens)
    out, lse = cpu_decode_attention_reference(q.cpu(), k_pages, v_pages, block_tables.cpu(),
                                              context_lens.cpu(), scale)
    return out.to(q.device), lse.to(q.device)


def device_suffix_attention(
    q: torch.Tensor,  # [B, Hq, D] (device)
    blocks: torch.Tensor,  # [N, 2, block_size, Hkv, D]: one layer of the device pool
    block_tables: torch.Tensor,  # [B, max_blocks] int32 (on q's device)
    context_lens: torch.Tensor,  # [B] int32 (on q's device)
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """host_attention's contract over blocks of the device pool (the device suffix of rows
    whose oldest blocks are on the host): the same kernel reads them in place; the
    reference gathers the rows' blocks into contiguous tiles first."""
    heads = blocks.transpose(2, 3)  # [N, 2, Hkv, bs, D]: a page view with strided rows
    kernel = _kernel_for(q, scale)
    if kernel is not None:
        return kernel(q, heads[:, 0], heads[:, 1], block_tables, context_lens)
    ids = block_tables.long()
    used = heads[ids.flatten()].cpu().contiguous()
    tables = torch.arange(ids.numel(), dtype=torch.int32).view(ids.shape)
    out, lse = cpu_decode_attention_reference(q.cpu(), used[:, 0], used[:, 1], tables,
                                              context_lens.cpu(), scale)
    return out.to(q.device), lse.to(q.device)


def _kernel_for(q: torch.Tensor, scale: float) -> Callable[..., tuple[torch.Tensor,
                                                                      torch.Tensor]] | None:
    """The zero-copy kernel where it runs: on a GPU, at the kernel's scale of 1/sqrt(D)
    (every model here; another scale takes torch)."""
    kernel = _kernel() if q.is_cuda else None
    if kernel is not None and math.isclose(scale, q.shape[-1] ** -0.5, rel_tol=1e-6):
        return kernel
    return None
