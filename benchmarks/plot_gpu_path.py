"""Plot and tabulate benchmarks/results/gpu_path_h200.json (made on the GPU by
bench_gpu_path.py); runs anywhere, so plots come from the committed JSON.

  python benchmarks/plot_gpu_path.py benchmarks/results/gpu_path_h200.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path: Path) -> Path:
    d = json.loads(path.read_text())
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for model in ("llama-3.1-8b", "llama-2-13b"):
        for ctx in (512, 2048, 8192):
            rows = [r for r in d["decode"] if r["model"] == model and r["context"] == ctx
                    and "median_s" in r]
            if rows:
                ax.plot([r["batch"] for r in rows], [r["fraction_of_roofline"] for r in rows],
                        marker="o", label=f"{model} ctx {ctx}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (decode requests)")
    ax.set_ylabel("HBM roofline / measured step")
    ax.set_title("decode step vs HBM roofline (4.24 TB/s)")
    ax.axhline(0.85, ls="--", c="grey")
    ax.legend(fontsize=7)
    ax = axes[1]
    pre = d.get("prefill", [])
    ax.bar([str(r["tokens"]) for r in pre], [r["tflops"] for r in pre])
    ax.axhline(761, ls="--", c="grey", label="measured bf16 GEMM peak")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("prefill (llama-3.1-8b)")
    ax.legend(fontsize=7)
    ax = axes[2]
    for b in (64, 256):
        rows = [r for r in d.get("layers_per_block", []) if r["batch"] == b]
        ax.plot([str(r["layers_per_block"]) for r in rows], [r["median_s"] * 1e3 for r in rows],
                marker="o", label=f"batch {b}, ctx 2048")
    ax.set_xlabel("F (layers per KV block; 32 = vLLM layout)")
    ax.set_ylabel("decode step (ms)")
    ax.set_title("effect of F (llama-3.1-8b)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(plot(Path(sys.argv[1])))
