"""Small host-side helpers shared by the kernel wrappers (no kernels here)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (the CPU interpreter), where bf16 math is unreliable and
    kernels upcast their loads to fp32."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision. fp32 inputs need "ieee" to stay within 1e-5 of the reference
    (tf32 would round operands to 10 mantissa bits); bf16/fp16 ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def upcast(dtype: torch.dtype) -> bool:
    return interpreting() and dtype != torch.float32


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check(cond: bool, msg: str | Callable[[], str]) -> None:
    """Raise ValueError(msg) unless cond. A message that formats shapes is passed as a
    lambda: the wrappers run once per layer on the hot path, where formatting every
    message in advance cost more host time than the checks themselves."""
    if not cond:
        raise ValueError(msg() if callable(msg) else msg)


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must be contiguous, strides {t.stride()}")


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 4  # interpreter: a few splits exercise the reduction without slowing tests


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _fix_interpreter_scalar_index() -> None:
    """Triton 3.6's interpreter turns a scalar tensor into a Python int with
    `int(ndarray_of_shape_(1,))`, which NumPy >= 2.4 rejects, so `range(lo, hi)` over loaded
    bounds fails. Re-patch `__index__` to read the single element instead."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_kvtier_fixed", False):
        return

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._kvtier_fixed = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


if interpreting():
    _fix_interpreter_scalar_index()
