"""The simulator prices prefix-cache hits: a request whose prefix is cached is planned (by
the real scheduler and cache) as a chunk at the cached offset, and the cost model prices
that chunk as attention over the whole context plus only the new tokens' linear work."""

from pathlib import Path

import pytest

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel
from kvtier.costmodel.operators import Shapes, causal_pairs, step_ops
from kvtier.costmodel.shape import StepShape
from kvtier.engine.args import EngineArgs
from kvtier.model.loader import resolve_model_config
from kvtier.sampling_params import SamplingParams
from kvtier.sim.engine import build_sim_engine

CALIB_8B = Path(__file__).resolve().parents[2] / "results/calibration/calib_h200_llama-3.1-8b.json"
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False)


def _mc():
    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    return mc


def test_a_chunk_at_a_cached_offset_counts_new_tokens_linear_work_and_the_whole_context():
    s = Shapes.of(_mc())
    n, cached = 40, 4096
    hit = {o.name: o for o in step_ops(s, StepShape(prefills=((n, cached),), num_sampled=1))}
    full = {o.name: o for o in step_ops(s, StepShape(prefills=((n + cached, 0),), num_sampled=1))}
    qkv_n, qkv_k = s.gemm_dims()["qkv"]
    assert hit["qkv"].flops == 2.0 * n * qkv_n * qkv_k  # the GEMMs see the new tokens only
    assert hit["qkv"].flops / full["qkv"].flops == pytest.approx(n / (n + cached))
    pairs = n * cached + n * (n + 1) // 2  # each new query attends to the cache and its causal past
    assert causal_pairs(n, cached) == pairs
    assert hit["attn_prefill"].flops == 4.0 * s.heads * s.head_dim * pairs
    # The cached context's K and V are read (per layer): that much more than n from scratch.
    alone = {o.name: o for o in step_ops(s, StepShape(prefills=((n, 0),), num_sampled=1))}
    extra = hit["attn_prefill"].bytes - alone["attn_prefill"].bytes
    assert extra == 2 * s.kv * s.elem * cached


@pytest.mark.parametrize("calibrated", [False, True])
def test_a_hit_costs_between_its_new_tokens_alone_and_the_whole_prompt(calibrated):
    if calibrated and not CALIB_8B.is_file():
        pytest.skip(f"{CALIB_8B} absent")
    calib = Calibration.load(CALIB_8B) if calibrated else None
    model = CostModel(_mc(), get_hardware("h200"), calib)

    def cost(n: int, start: int) -> float:
        return model.predict(StepShape(prefills=((n, start),), num_sampled=1)).total_s

    # 2,048 new tokens: enough device work that the eager step is not bound by its
    # launches, whose host time would hide the attention over the cache (a smaller chunk
    # costs the same at any offset there: the calibrated launch time per kernel is long).
    hit, alone, whole = cost(2048, 8192), cost(2048, 0), cost(2048 + 8192, 0)
    assert alone < hit < whole / 3


def _ttft_of_second(enable: bool) -> tuple[float, tuple, float]:
    """(TTFT of a request after one with the same 4,000-token prefix finished, its first
    step's prefill rows, that step's predicted seconds)."""
    engine = build_sim_engine(EngineArgs(model="llama-3.1-8b", load_format="dummy",
                                         max_model_len=8192, enable_prefix_caching=enable),
                              "h200", record_steps=True)
    doc = list(range(100, 4100))
    engine.add_request("a", doc + [1, 2, 3], GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
    first_step = len(engine.executor.steps)
    engine.add_request("b", doc + [5, 6, 7], GREEDY)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    (done,) = [o for o in outs if o.finished]
    step = engine.executor.steps[first_step]
    return done.metrics.first_token_time - done.metrics.arrival_time, step.shape.prefills, \
        step.cost.total_s


def test_the_simulator_skips_the_cached_prefix():
    ttft_on, rows_on, step_on = _ttft_of_second(True)
    ttft_off, rows_off, _ = _ttft_of_second(False)
    assert rows_on == ((3, 4000),)  # 250 cached blocks of 16; the new tokens at offset 4000
    assert rows_off == ((2048, 0),)  # the first chunk of a full prefill
    engine = build_sim_engine(EngineArgs(model="llama-3.1-8b", load_format="dummy",
                                         max_model_len=8192), "h200")
    shape = StepShape(prefills=rows_on, num_sampled=1)
    assert step_on == pytest.approx(engine.executor.cost_model.predict(shape).total_s)
    assert ttft_on < ttft_off / 10
