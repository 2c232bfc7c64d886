"""The long-prefill ITL sweep end to end in the simulator, on a small made-up L-Eval file."""

from __future__ import annotations

import json
import random

from benchmarks.serving.bench_long_prefill_itl import choose, main


def write_leval(path, num_docs: int = 2, words: int = 4000) -> None:
    rng = random.Random(0)
    vocab = ["cache", "memory", "tier", "kernel", "decode", "prefill", "block", "host"]
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(num_docs):
            doc = " ".join(rng.choice(vocab) for _ in range(words))
            f.write(json.dumps({"input": doc, "instructions": ["Summarize.", "Name the tiers."],
                                "outputs": [" ".join(vocab * 4), " ".join(vocab * 3)]}) + "\n")


def test_sweep_writes_each_setting_and_the_cap_cuts_the_longest_gap(tmp_path):
    data, out = tmp_path / "leval.jsonl", tmp_path / "result.json"
    write_leval(data)
    main(["--simulate", "--leval-path", str(data), "--num-prompts", "4", "--rate", "2",
          "--max-model-len", "8192", "--thresholds", "0,512", "--warmup-requests", "0",
          "--out", str(out)])
    result = json.loads(out.read_text())
    rows = {r["long_prefill_token_threshold"]: r for r in result["settings"]}
    assert set(rows) == {0, 512} and result["tpot_slo_ms"] == 100.0
    assert result["workload"]["num_requests"] == 4 and result["workload"]["mean_prompt_len"] > 4000
    for row in rows.values():
        assert row["num_completed"] == 4
        assert row["itl_ms"]["p50"] <= row["itl_ms"]["p90"] <= row["itl_ms"]["p99"]
    # A decode sharing a step with a whole 4,000-token prompt waits for all of it; with the
    # cap it waits for 512 tokens at most; the prompts take more steps to finish.
    assert rows[512]["itl_ms"]["max"] < rows[0]["itl_ms"]["max"] / 2
    assert rows[512]["num_steps"] > rows[0]["num_steps"]
    assert set(result["choice"]) == {"p90", "p99"}


def row(threshold: int, p90: float, ttft: float) -> dict:
    return {"long_prefill_token_threshold": threshold,
            "effective_long_prefill_token_threshold": threshold,
            "itl_ms": {"p90": p90}, "ttft_ms": {"p50": ttft, "p90": 2 * ttft}}


def test_choice_is_the_largest_cap_inside_the_slo():
    rows = [row(0, 240.0, 100.0), row(4096, 150.0, 110.0), row(2048, 90.0, 120.0),
            row(512, 40.0, 300.0)]
    got = choose(rows, 100.0, "p90")
    assert got["long_prefill_token_threshold"] == 2048
    assert got["ttft_p50_vs_no_cap"] == 1.2
    assert choose(rows, 30.0, "p90")["long_prefill_token_threshold"] is None
    assert choose(rows, 300.0, "p90")["long_prefill_token_threshold"] == 0  # no cap needed
