"""Plot bench_gpu_path.py's result JSONs (made on the GPU); runs anywhere, so plots come
from the committed files. Several files merge part by part, a later file's part replacing
an earlier one's (the parts of one plot may come from different device calls):

  python -m benchmarks.gpu_path.plot_gpu_path results/gpu_path/gpu_path_h200.json
  python -m benchmarks.gpu_path.plot_gpu_path --out results/gpu_path/gpu_path_h200_session10.png \
      results/gpu_path/gpu_path_h200_prefill_e4525a3.json \
      results/gpu_path/gpu_path_h200_a4b588d.json results/gpu_path/gpu_path_h200_4193e30.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def merged(paths: list[Path]) -> dict:
    d: dict = {}
    for path in paths:
        d.update(json.loads(path.read_text()))
    return d


def plot(paths: list[Path], out: Path | None = None) -> Path:
    d = merged(paths)
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
                marker="o", label=f"batch {b}, ctx 2048, runner sync step")
        engine = [r for r in d.get("layers_per_block_engine", []) if r["batch"] == b]
        if engine:  # repeats alternate F: one point per F, their mean
            fs = sorted({r["layers_per_block"] for r in engine})
            ax.plot([str(f) for f in fs],
                    [statistics.mean(r["step_ms"] for r in engine if r["layers_per_block"] == f)
                     for f in fs], marker="s", ls="--", label=f"batch {b}, engine async step")
    ax.set_xlabel("F (layers per KV block; 32 = vLLM layout)")
    ax.set_ylabel("decode step (ms)")
    ax.set_title("effect of F (llama-3.1-8b)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = out or paths[-1].with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="default: the last file's .png")
    args = ap.parse_args()
    print(plot(args.results, args.out))
