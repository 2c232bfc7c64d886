"""The figure of a `bench_prefix_cache` result: TTFT CDFs of the two arms and, per request,
the TTFT ratio (off / on) against the cached fraction of its prompt; the offline part's
throughput per run.

  python -m benchmarks.engine.plot_prefix_cache results/engine/prefix_cache_leval_sim_h200.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ARMS = ("off", "on")


def plot(result_path: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads(Path(result_path).read_text())
    base = Path(result_path).with_suffix("")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if res["part"] == "offline":
        runs = res["runs"]
        axes[0].bar(range(len(runs)), [r["output_tokens_per_s"] for r in runs],
                    color=["tab:green" if r["prefix_caching"] else "tab:gray" for r in runs])
        axes[0].set_xticks(range(len(runs)), ["on" if r["prefix_caching"] else "off"
                                              for r in runs])
        axes[0].set_ylabel("output tokens/s")
        axes[0].set_title(f"offline ShareGPT {res['num_requests']}: on/off "
                          f"{res['on_over_off']:.3f}")
        axes[1].axis("off")
    else:
        for arm in ARMS:
            ttft = sorted(t for t in res[arm]["per_request"]["ttft_ms"] if t is not None)
            axes[0].step(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], where="post",
                         label=f"caching {arm}")
        axes[0].set_xscale("log")
        axes[0].set_xlabel("TTFT (ms)")
        axes[0].set_ylabel("fraction of requests")
        axes[0].legend()
        axes[0].set_title(f"{res['part']}: TTFT p50 off/on {res['comparison']['ttft_p50_ratio']:.1f}x")
        on = res["on"]["per_request"]
        frac = [c / p for c, p in zip(on["cached_tokens"], on["prompt_len"])]
        ratio = [a / b if a and b else None for a, b in zip(res["off"]["per_request"]["ttft_ms"],
                                                            on["ttft_ms"])]
        pts = [(f, r) for f, r in zip(frac, ratio) if r is not None]
        axes[1].scatter([f for f, _ in pts], [r for _, r in pts], s=12)
        axes[1].set_yscale("log")
        axes[1].axhline(10, color="tab:red", lw=0.8, ls="--")
        axes[1].set_xlabel("cached fraction of the prompt (caching on)")
        axes[1].set_ylabel("TTFT off / on, same request")
    fig.tight_layout()
    path = base.with_name(base.name + ".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="result JSONs of bench_prefix_cache")
    for path in ap.parse_args().results:
        print(plot(path))


if __name__ == "__main__":
    main()
