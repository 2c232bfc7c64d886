"""The zero-copy decode kernel compiles for an H100/H200 (sm_90) on a machine without a GPU:
Triton lowers it to PTX and runs its bundled ptxas. Its host-tile reads are 16 B per lane and
skip L1 (`cp.async.cg`, what Triton's pipelined loads become), and a program takes at most
half an SM's shared memory. Run as a module without TRITON_INTERPRET to print one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compile_kernel(elem: str) -> dict[str, object]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kvtier.kernels import host_decode_attention as hda

    fn = hda._host_decode_kernel
    launch = hda.default_launch(hda.torch.bfloat16 if elem == "bf16" else hda.torch.float32)
    const = dict(G=4, G_PAD=16, HEAD_DIM=128, D_PAD=128, PAGE_SIZE=16, BLOCK_N=launch.block_n,
                 SINGLE_SPLIT=False, UPCAST=False, PRECISION="tf32" if elem == "bf16" else "ieee")
    sig = {name: "i32" for name in fn.arg_names}
    sig.update({name: f"*{elem}" for name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")})
    sig.update({name: "*fp32" for name in ("lse_ptr", "part_ptr", "part_lse_ptr")})
    sig.update(bt_ptr="*i32", lens_ptr="*i32", qk_scale="fp32")
    sig.update({name: "constexpr" for name in const})
    runtime = {"qk_scale", "num_splits", "stride_bt", *const}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in runtime}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": launch.num_warps,
                                     "num_stages": launch.num_stages})
    lines = [ln.strip() for ln in kernel.asm["ptx"].splitlines()]
    return {"shared": kernel.metadata.shared,
            "tile_reads": [ln for ln in lines if "cp.async" in ln and "shared.global" in ln],
            "plain_loads": [ln for ln in lines if " ld.global" in ln or ln.startswith("ld.global")]}


def _ptxas_available() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return Path(get_ptxas(90).path).exists()
    except Exception:  # noqa: BLE001 - no NVIDIA backend in this Triton
        return False


@pytest.mark.skipif(not _ptxas_available(), reason="Triton's NVIDIA backend (ptxas) is absent")
def test_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.test_host_decode_attention_sm90"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for elem, asm in json.loads(proc.stdout).items():
        rows = [ln for ln in asm["tile_reads"] if ", 0x10" in ln]  # the 4 B ones: block ids
        assert rows, f"{elem}: no 16 B cp.async tile reads"
        assert all("cp.async.cg." in ln for ln in rows), rows[:4]
        assert asm["shared"] <= 227 * 1024 // 2, f"{elem}: {asm['shared']} B of shared memory"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without TRITON_INTERPRET"
    print(json.dumps({elem: compile_kernel(elem) for elem in ("bf16", "fp32")}))
