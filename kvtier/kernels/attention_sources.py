"""Device functions shared by the attention kernels: KV *sources* and the online-softmax step.

An attention kernel walks a request's context as a list of source segments, each a range of
absolute token positions whose K/V live somewhere different:

    positions  [0, prefix_len)        dense segment  (a dropped prefix: KV recomputed this step)
               [prefix_len, seq_len)  paged segment  (the block table into the KV pool)
               ... later: a host segment read through a UVA pointer (zero-copy)

For each segment the kernel loads [BLOCK_N, D] K/V tiles with that source's loader and feeds
them to `online_softmax_update`, which owns the running (m, l, acc) state. Adding a source is
one loader plus one loop; the softmax and the split-K reduction do not change.

Conventions (all kernels):
- scores are kept in the log2 domain: `qk_scale = scale * log2(e)` and `exp2` everywhere,
  because exp2 is one MUFU instruction and exp is exp2 plus a multiply;
- tiles are loaded in the cache dtype and upcast only when `UPCAST` (the CPU interpreter gets
  bf16 arithmetic wrong; fp32 inputs are already fp32). On the GPU bf16 tiles go straight into
  `tl.dot` (bf16 tensor cores, fp32 accumulate) and P is cast to V's dtype for the PV product,
  as FlashAttention does.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_update(
    q,  # [M, D_PAD] (already loaded; rows are query (token, head) pairs)
    k,  # [BLOCK_N, D_PAD]
    v,  # [BLOCK_N, D_PAD]
    m,  # [M] fp32 running max of scores (log2 domain)
    l_i,  # [M] fp32 running sum of exp2(score - m)
    acc,  # [M, D_PAD] fp32 running sum of p * v
    allowed,  # [M, BLOCK_N] or [1, BLOCK_N] bool: which scores count
    qk_scale,
    PRECISION: tl.constexpr,
):
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [M, BLOCK_N]
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    # A row with every score masked so far keeps m = -inf; using 0 as its reference stops
    # exp2(-inf - -inf) = NaN. Its p are all 0, so the reference value does not matter.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def load_paged_kv_tile(
    kv_ptr,  # layer view base: [num_blocks, 2, block_size, Hkv, D]
    block_table_ptr,  # this request's row of the block table
    pos,  # [BLOCK_N] absolute token positions
    valid,  # [BLOCK_N] bool
    d,  # [D_PAD] offsets along head_dim
    d_ok,  # [D_PAD] bool
    kv_head,
    stride_block,
    stride_kv,
    stride_tok,
    stride_head,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """K and V ([BLOCK_N, D_PAD]) of the tokens at `pos`, zero where not valid.

    The page is looked up per token (cache-resident repeats of the same table entry), so a
    tile may start anywhere and span several pages; BLOCK_SIZE is a power of two in practice,
    making `//` and `%` shifts."""
    page = tl.load(block_table_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
    row = page.to(tl.int64) * stride_block + (pos % BLOCK_SIZE) * stride_tok + kv_head * stride_head
    offs = row[:, None] + d[None, :]
    mask = valid[:, None] & d_ok[None, :]
    k = tl.load(kv_ptr + offs, mask=mask, other=0.0)
    v = tl.load(kv_ptr + stride_kv + offs, mask=mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def load_dense_kv_tile(
    k_ptr,  # [rows, Hkv, D], this request's first row already added
    v_ptr,
    rows,  # [BLOCK_N] row indices into the dense segment
    valid,  # [BLOCK_N] bool
    d,
    d_ok,
    kv_head,
    stride_tok,
    stride_head,
    UPCAST: tl.constexpr,
):
    """K and V ([BLOCK_N, D_PAD]) of a dense segment (e.g. a recomputed dropped prefix)."""
    offs = rows.to(tl.int64)[:, None] * stride_tok + kv_head * stride_head + d[None, :]
    mask = valid[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v
