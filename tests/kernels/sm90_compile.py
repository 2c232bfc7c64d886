"""Compile the host page I/O kernel for an H100/H200 (sm_90) on a machine without a GPU:
Triton lowers it to PTX and runs its bundled ptxas, which refuses cache-hint combinations PTX
does not allow. Run as `python -m tests.kernels.sm90_compile` without TRITON_INTERPRET (the
interpreter replaces the kernels by Python functions); prints one JSON object: the ptxas
error if any, the kernel's global load/store instructions, and whether it reads the global
timer (the paced path). With `handoff`: the PTX of the CPU hand-over's kernels
(host_handoff.py), which have no interpreter path at all."""

from __future__ import annotations

import json
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kvtier.kernels import host_handoff, host_page_io

SM90 = GPUTarget("cuda", 90, 32)


def compile_copy_kernel(elem: str) -> str:
    """PTX of _copy_rows_kernel for a Llama-8B-like block (16 tokens, 8 heads, D 128), its
    pointers and ints specialised as 16-divisible the way a real launch sees them."""
    fn = host_page_io._copy_rows_kernel
    const = dict(R1=16, R2=8, ROWS_PER_PAGE=2 * 2 * 16 * 8, HEAD_DIM=128, D_PAD=128,
                 TILE_ROWS=256, UPCAST=False)
    sig = {name: "i32" for name in fn.arg_names}
    sig.update(src_ptr=f"*{elem}", dst_ptr=f"*{elem}", src_ids_ptr="*i64", dst_ids_ptr="*i64")
    sig.update({name: "constexpr" for name in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in const}
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    kernel = triton.compile(src, target=SM90, options={"num_warps": host_page_io.NUM_WARPS})
    return kernel.asm["ptx"]


def compile_handoff_kernels() -> str:
    """PTX of the CPU hand-over's two kernels (host_handoff.py) at a Llama-8B-like shape."""
    ptx = []
    for fn, pointers, const in (
        (host_handoff._rows_to_host_kernel,
         dict(q="*bf16", k="*bf16", v="*bf16", dst="*bf16", ready="*i32", counter="*i32",
              epoch="*i32"), dict(HQ=32, HKV=8, D=128, BLOCK_HQ=32, BLOCK_HKV=8, BLOCK_D=128)),
        (host_handoff._rows_from_host_kernel,
         dict(src="*bf16", out="*bf16", done="*i32", epoch="*i32", error="*i32",
              timeout_ns="i64"), dict(HQ=32, D=128, BLOCK_HQ=32, BLOCK_D=128)),
    ):
        sig = {name: "i32" for name in fn.arg_names}
        sig.update(pointers)
        sig.update({name: "constexpr" for name in const})
        src = ASTSource(fn=fn, signature=sig, constexprs=const)
        ptx.append(triton.compile(src, target=SM90, options={"num_warps": 4}).asm["ptx"])
    return "\n".join(ptx)


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without TRITON_INTERPRET"
    if sys.argv[1:] == ["handoff"]:
        print(compile_handoff_kernels())
        return
    out: dict[str, object] = {}
    for elem in ("fp32", "bf16"):
        try:
            ptx = compile_copy_kernel(elem)
        except Exception as e:  # noqa: BLE001 - the test reports ptxas's message
            out[elem] = {"error": str(e)[-2000:]}
            continue
        lines = [ln.strip() for ln in ptx.splitlines()]
        out[elem] = {"loads": [ln for ln in lines if " ld.global" in ln],
                     "stores": [ln for ln in lines if " st.global" in ln],
                     "reads_global_timer": any("%globaltimer" in ln for ln in lines)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
