"""The eLLM paper's scale: 3000 requests arriving at ~50 req/s (issue 6's figure; gamma gaps
with the paper's Azure-trace CV) with ShareGPT-like lengths, Llama-2-13B, must simulate in
under 60 s here."""

import random
import time
from pathlib import Path

import numpy as np
import pytest

from kvtier.bench.arrivals import PAPER_AZURE_CV, gamma_gaps
from kvtier.engine.args import EngineArgs
from kvtier.sim import build_sim_engine, run_simulation

CALIB = Path(__file__).parents[2] / "results/calibration/calib_h200_llama-2-13b.json"


def paper_requests(n: int = 3000, seed: int = 0):
    """ShareGPT-like lengths (log-normal, prompts <= 1024, prompt + output <= 2048) and
    gamma gaps of mean 20 ms with the paper's CV (1.69)."""
    rng = random.Random(seed)
    gaps = gamma_gaps(np.random.default_rng(seed), n - 1, 0.020, PAPER_AZURE_CV)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    reqs = []
    for t in arrivals:
        p = max(4, min(1024, int(rng.lognormvariate(5.0, 1.0))))
        o = max(4, min(2048 - p, int(rng.lognormvariate(5.0, 1.0))))
        reqs.append(([rng.randrange(32000) for _ in range(p)], o, float(t)))
    return reqs


@pytest.mark.parametrize("hardware", ["a100-80gb", "h200"])
def test_paper_scale_run_simulates_in_under_a_minute(hardware):
    reqs = paper_requests()
    rate = (len(reqs) - 1) / reqs[-1][2]
    assert 40 < rate < 60
    calib = CALIB if CALIB.exists() else None
    engine = build_sim_engine(EngineArgs(model="llama-2-13b", load_format="dummy",
                                         max_model_len=4096), hardware, calib)
    t0 = time.perf_counter()
    times = run_simulation(engine, reqs)
    wall = time.perf_counter() - t0
    assert all(t.finish_s is not None and t.output_len == o for t, (_, o, _) in zip(times, reqs))
    span = max(t.finish_s for t in times)
    print(f"{hardware}: 3000 requests, {span:.0f} s of virtual time in {wall:.1f} s")
    assert wall < 60
