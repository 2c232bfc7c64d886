"""Inline PTX the kernels share: the GPU's global timer, and loads, stores and fences at
system scope (what a GPU and a host thread synchronising through pinned memory need; the
PTX memory model's acquire/release). None has an interpreter path: a kernel that uses one
runs on a GPU only, and its torch reference is the CPU path."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def global_ns():
    """The GPU's global nanosecond timer (PTX %globaltimer); impure, so never hoisted."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def ld_acquire_sys(ptr):
    return tl.inline_asm_elementwise("ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [ptr],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def st_release_sys(ptr, value):
    return tl.inline_asm_elementwise("st.release.sys.global.b32 [$1], $2;\nmov.u32 $0, 0;",
                                     "=r,l,r", [ptr, value], dtype=tl.int32, is_pure=False,
                                     pack=1)


@triton.jit
def fence_sys():
    return tl.inline_asm_elementwise("fence.sc.sys;\nmov.u32 $0, 0;", "=r", [],
                                     dtype=tl.int32, is_pure=False, pack=1)
