"""eLLM's layer-level overlap in the simulator (issue 7, item 3): dropped prefixes recomputed
through every layer group against prefixes whose top groups come back from the host pool
each step while the lower groups recompute (`--ellm-host-groups`), under the same on-demand
drop rules, on the paper's ShareGPT load (llama-2-13b, 40 GiB of KV, the H200 calibration).

  python -m benchmarks.sim.sim_ellm_layer_overlap \
      --workload .carry/sharegpt_llama2_13b_1500.json \
      --calibration results/calibration/calib_h200_llama-2-13b.json \
      --out results/sim/sim_ellm_layer_overlap.json

Rows: recompute (the baseline), then ellm with each recompute budget rule at every split
h = 0 (recompute every group) .. G-1. `roofline_auto` is what `--ellm-host-groups auto`
picks from the roofline alone, `priced_auto` what it picks with a calibration (the cost
model's cheapest representative step: `choose_host_groups_priced`). `planned`: the
request-level planner's mode with nothing copied, the auto split at copy window 2, and at
window 0 (every copied group its own scratch). `priced_budget_tokens_at_ctx_400`: the
default budget by decode count, without and with the auto split.
"""

from __future__ import annotations

import dataclasses

from benchmarks.common import write_result
from benchmarks.sim.sim_ellm_sweeps import load_requests, run, workload_parser
from kvtier.costmodel.hardware import get_hardware
from kvtier.engine.args import EngineArgs
from kvtier.model.loader import resolve_model_config
from kvtier.policies.ellm.planner.layer_overlap import overlap_configs
from kvtier.sim import build_sim_engine


def main(argv: list[str] | None = None) -> None:
    ap = workload_parser()
    ap.add_argument("--budgets", default="auto,ridge,max")
    args = ap.parse_args(argv)
    reqs = load_requests(args)
    base = EngineArgs(model="llama-2-13b", load_format="dummy", max_model_len=2048,
                      kv_cache_gb=args.kv_cache_gb, swap_space=40, max_num_seqs=256)
    rows = [{"policy": "recompute", **run(args, base, reqs)}]
    print(rows[-1], flush=True)
    auto_args = dataclasses.replace(base, kv_policy="ellm", ellm_host_groups="auto")
    auto = auto_args.create_engine_config()
    h_roofline = auto.policy_options.prefix_host_groups
    h_priced = build_sim_engine(auto_args, "h200", args.calibration
                                ).config.policy_options.prefix_host_groups
    mc, _ = resolve_model_config("llama-2-13b", "dummy")
    groups = auto.cache.num_layer_groups(mc.num_layers)
    for budget in args.budgets.split(","):
        for h in range(groups):
            a = dataclasses.replace(base, kv_policy="ellm", ellm_recompute_budget=budget,
                                    ellm_host_groups=str(h))
            rows.append({"policy": "ellm", "recompute_budget": budget, "host_groups": h,
                         **run(args, a, reqs)})
            print(rows[-1], flush=True)
    planned = []  # the planner's mode: what the copy window's scratch (M_o) costs
    for h, window in (("0", 2), ("auto", 2), ("auto", 0)):
        a = dataclasses.replace(base, kv_policy="ellm", ellm_planner=True, ellm_host_groups=h,
                                ellm_copy_window=window)
        planned.append({"host_groups": h, "copy_window": window, **run(args, a, reqs)})
        print(planned[-1], flush=True)
    budget = {}  # the priced budget (prefix tokens a step) by decodes, context 400
    for h in ("0", "auto"):
        e = build_sim_engine(dataclasses.replace(auto_args, ellm_host_groups=h), "h200",
                             args.calibration)
        b = e.config.policy_options.step_budget
        budget[h] = {n: b.tokens(n, 400) for n in (16, 64, 128, 170, 200, 256)}
    # The roofline chooser's table for a 256-token prefix (what `auto` weighs without one).
    split_ms = [{"host_groups": c.host_groups, "recompute_ms": 1e3 * c.recompute_s,
                 "copy_ms": 1e3 * c.copy_s, "step_ms": 1e3 * c.step_s}
                for c in overlap_configs(mc, get_hardware("h200"), 4, 256)]
    write_result(args.out, {"benchmark": "sim_ellm_layer_overlap", "model": "llama-2-13b",
                            "workload": args.workload, "num_prompts": args.num_prompts,
                            "rate": args.rate, "kv_cache_gb": args.kv_cache_gb,
                            "calibration": args.calibration, "layer_groups": groups,
                            "roofline_auto": h_roofline, "priced_auto": h_priced,
                            "rows": rows, "planned": planned,
                            "priced_budget_tokens_at_ctx_400": budget,
                            "roofline_splits_prefix_256": split_ms})


if __name__ == "__main__":
    main()
