"""The fixed cost of a step that loads host-tier pages, fit from the measured break-even
(bench_strata_breakeven: a request's TTFT with its prefix loaded from the host tier and
with it hit on the device, by prefix length and io-backend).

A host hit's TTFT less the device hit's is the load's share: its pages' copy time (the
hardware profile's curve, kvtier/offload/items.copy_seconds) plus what the copy curve does
not hold (staging the pages, the layer groups' events, the forward waiting on the copy
stream). That remainder is fit as a constant per io-backend over the short prefixes (at
most --max-tokens), where the copy itself is a few per cent of it and layer-wise loading
has no prefill to hide it under. The longer rows are reported beside the priced (serial)
load: there the question's prefill hides part of the copy, so the price is an upper bound.

  python -m benchmarks.policies.fit_host_loads --out results/calibration/host_loads_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from benchmarks.common import write_result
from benchmarks.policies.strata_breakeven import cost_model, hit_pages
from kvtier.offload.items import copy_seconds

MEASURED = "results/policies/strata_breakeven_measured_h200.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--measured", default=MEASURED, help="bench_strata_breakeven's result")
    p.add_argument("--max-tokens", type=int, default=64, help="the rows the constant is fit on")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def fit_backend(rows: list[dict[str, Any]], copy_s: Any, max_tokens: int) -> dict[str, Any]:
    """The constant (mean remainder over the short rows) and every row's parts."""
    parts = []
    for r in rows:
        load = r["host_hit_ttft_s"] - r["device_hit_ttft_s"]
        copy = copy_s(r["tokens"])
        parts.append({"tokens": r["tokens"], "measured_load_s": load, "priced_copy_s": copy,
                      "remainder_s": load - copy})
    short = [p["remainder_s"] for p in parts if p["tokens"] <= max_tokens]
    fixed = statistics.fmean(short)
    for p in parts:
        p["priced_load_s"] = p["priced_copy_s"] + fixed
    return {"step_fixed_s": fixed, "fit_rows": len(short), "rows": parts}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with open(args.measured) as f:
        measured = json.load(f)
    model = measured["model"]
    cm, config = cost_model(model, argparse.Namespace(gpu="h200", calibration=True,
                                                      max_num_batched_tokens=None))
    fits = {}
    for backend, res in measured["io_backends"].items():
        direct = backend == "direct"
        fits[backend] = fit_backend(
            res["rows"], lambda n, d=direct: copy_seconds(cm, hit_pages(config, n), True, direct=d),
            args.max_tokens)
        print(f"{backend:7s}: {1e3 * fits[backend]['step_fixed_s']:.2f} ms a loading step")
    write_result(args.out, {"measured": args.measured, "model": model,
                            "max_tokens": args.max_tokens, "io_backends": fits})


if __name__ == "__main__":
    main()
