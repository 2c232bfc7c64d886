"""SwiGLU's activation: `silu(gate) * up` from the fused gate_up projection in one pass.

Rounding follows the torch model (HF Llama: `act_fn(gate) * up` in the model dtype): SiLU in
fp32, rounded to the dtype, then the product rounded again. One kernel reads gate_up once and
writes the result, where torch's two kernels read and write the intermediate once more (a large
share of the MLP's elementwise bytes, the intermediate is several times the hidden width).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check
from kvtier.kernels.pdl import pdl_launch, wait_for_previous_kernel

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, stride_x,  # [N, 2 * inter]: gate then up
    out_ptr, stride_out,  # [N, inter]
    inter,
    BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    y = act * up.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] -> silu(gate_up[..., :I]) * gate_up[..., I:]  ([..., I])"""
    two_i = gate_up.shape[-1]
    check(two_i % 2 == 0, lambda: f"last dim {two_i} must be even (gate and up halves)")
    check(gate_up.stride(-1) == 1, "gate_up: last dim must be contiguous")
    inter = two_i // 2
    x2 = gate_up.reshape(-1, two_i)
    out = torch.empty((x2.shape[0], inter), dtype=gate_up.dtype, device=gate_up.device)
    if x2.shape[0] > 0:
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, BLOCK))](
            x2, x2.stride(0), out, out.stride(0), inter, BLOCK=BLOCK, num_warps=4,
            **pdl_launch(gate_up.device),
        )
    return out.view(*gate_up.shape[:-1], inter)


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
