"""The figure of a `bench_strata` result, one PNG beside each JSON: TTFT p50 and p90 of
each variant (log scale, the ratio to (a) over each bar) with its output throughput, and
where each variant's prompt tokens came from (device-tier hits, host-tier hits, prefetched
from the host while waiting, computed).

  python -m benchmarks.policies.plot_strata results/policies/strata_leval_shuffled_h200.json \\
      results/policies/strata_multiturn_h200.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SOURCES = (("gpu_hit_tokens", "device hit", "tab:green"),
           ("host_hit_tokens", "host hit", "tab:blue"),
           ("prefetched_tokens", "prefetched", "tab:cyan"))


def token_sources(variant: dict[str, Any], prompt_tokens: int) -> dict[str, int]:
    """Prompt tokens by where they came from; (a) has no host tier, its hits are the
    device tier's. A prefetched token is a device hit when its request is admitted: it is
    counted once, as prefetched."""
    summary, tier = variant["summary"], variant["host_tier"]
    if tier is None:
        cached = summary.get("num_cached_tokens") or 0
        parts = {"gpu_hit_tokens": cached, "host_hit_tokens": 0, "prefetched_tokens": 0}
    else:
        parts = {key: tier[key] for key, _, _ in SOURCES}
        parts["gpu_hit_tokens"] = max(0, parts["gpu_hit_tokens"] - parts["prefetched_tokens"])
    parts["computed"] = max(0, prompt_tokens - sum(parts.values()))
    return parts


def plot(result_path: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads(Path(result_path).read_text())
    names = list(res["variants"])
    variants = [res["variants"][n] for n in names]
    labels = [f"{n}\n{v['label']}" for n, v in zip(names, variants)]
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.38
    for k, (pct, color) in enumerate((("p50", "tab:blue"), ("p90", "tab:orange"))):
        vals = [1e3 * v["summary"]["ttft_s"][pct] for v in variants]
        xs = [i + (k - 0.5) * width for i in range(len(names))]
        ax_t.bar(xs, vals, width, color=color, label=f"TTFT {pct}")
        for x, y in zip(xs, vals):
            ax_t.annotate(f"{vals[0] / y:.1f}x", (x, y), ha="center", va="bottom", fontsize=8)
    ax_t.set_yscale("log")
    ax_t.set_ylim(bottom=0.5 * min(1e3 * v["summary"]["ttft_s"]["p50"] for v in variants))
    ax_t.set_ylabel("TTFT (ms)")
    ax_t.set_xticks(range(len(names)), [
        f"{lab}\n{v['summary']['output_throughput']:.0f} tok/s"
        for lab, v in zip(labels, variants)], fontsize=8)
    ax_t.legend(fontsize=8)
    model = res["environment"].get("command", "").split("--model ")[-1].split()[0]
    ax_t.set_title(f"{Path(result_path).stem} ({model}): ratio to (a) over each bar",
                   fontsize=9)
    prompt_tokens = res["workload_summary"]["total_prompt_tokens"]
    bottoms = [0.0] * len(names)
    for key, name, color in (*SOURCES, ("computed", "computed", "tab:gray")):
        vals = [token_sources(v, prompt_tokens)[key] / 1e3 for v in variants]
        ax_s.bar(range(len(names)), vals, bottom=bottoms, color=color, label=name)
        bottoms = [b + x for b, x in zip(bottoms, vals)]
    ax_s.set_xticks(range(len(names)), labels, fontsize=8)
    ax_s.set_ylabel("prompt tokens (thousands)")
    ax_s.set_title("where the workload's prompt tokens came from", fontsize=9)
    ax_s.legend(fontsize=8)
    fig.tight_layout()
    path = Path(result_path).with_suffix(".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("results", nargs="+", help="bench_strata result JSONs")
    for path in p.parse_args(argv).results:
        print(f"wrote {plot(path)}")


if __name__ == "__main__":
    main()
