"""The offline benchmark's split of steps by batch range, and its floor's, line up."""

import numpy as np

from benchmarks.common import batch_bin
from benchmarks.offline.bench_offline_throughput import step_summary
from benchmarks.offline.offline_floor import compare_by_batch, decode_floor
from kvtier.model.loader import resolve_model_config


def test_batch_bins_cover_every_size_once():
    assert [batch_bin(b) for b in (1, 16, 17, 64, 65, 512, 513, 1024, 1025)] == [
        "1-16", "1-16", "17-64", "17-64", "65-128", "257-512", "513-1024", "513-1024", "1025+"]


def test_floor_and_measured_steps_split_alike():
    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    prompts, outputs = np.array([10, 20, 30]), np.array([2, 5, 40])
    floor = decode_floor(mc, prompts, outputs, at_batches=[])
    # step t serves every request with more than t outputs: 3 rows twice, 2 thrice, then 1
    assert {k: v["count"] for k, v in floor["by_batch"].items()} == {"1-16": 40}
    assert sum(v["total_s"] for v in floor["by_batch"].values()) == floor["seconds"]
    steps = [(0.5, 3, 60), (0.01, 3, 3), (0.01, 2, 2), (0.02, 1, 1)]  # one mixed step first
    measured = step_summary(steps)
    assert measured["mixed"]["count"] == 1
    assert measured["decode_only_by_batch"]["1-16"]["count"] == 3
    row = compare_by_batch(floor["by_batch"], measured["decode_only_by_batch"])["1-16"]
    assert row["floor_steps"] == 40 and row["measured_steps"] == 3
    assert row["excess_s"] == row["measured_s"] - row["floor_s"]
