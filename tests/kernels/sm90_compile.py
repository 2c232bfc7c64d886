"""Compile the host page I/O kernel for an H100/H200 (sm_90) on a machine without a GPU:
Triton lowers it to PTX and runs its bundled ptxas, which refuses cache-hint combinations PTX
does not allow. Run as `python -m tests.kernels.sm90_compile` without TRITON_INTERPRET (the
interpreter replaces the kernels by Python functions); prints one JSON object: the ptxas
error if any, the kernel's global load/store instructions, and whether it reads the global
timer (the paced path)."""

from __future__ import annotations

import json
import os

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kvtier.kernels import host_page_io

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


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without TRITON_INTERPRET"
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
