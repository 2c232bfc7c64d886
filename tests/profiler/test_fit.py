import math
import random

import pytest

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.costmodel.shape import StepShape
from kvtier.profiler.fit import fit_calibration
from tests.costmodel.synthetic import HOST, calibration, model_config, raw_measurements


def synthetic_steps(seed: int = 0) -> list[dict]:
    """Whole steps whose wall times the synthetic calibration (with HOST) predicts exactly."""
    cm = CostModel(model_config(), get_hardware("h200"), calibration(),
                   CostModelConfig(block_bytes=raw_measurements()["meta"]["block_bytes"]))
    rng = random.Random(seed)
    steps = []
    for b in (1, 3, 8, 16, 30, 64, 100, 128, 200, 256):
        ctx = rng.randint(100, 1500)
        steps.append(StepShape(b, b * ctx, ctx, (), b))
    for b in (0, 5, 40, 120):
        for pre in ((30,), (400,), (1000, 200)):
            ctx = rng.randint(100, 1500)
            steps.append(StepShape(b, b * ctx, ctx, tuple((n, 0) for n in pre), b + len(pre)))
    out = []
    for sh in steps:
        graph = cm.graph_batch(sh) is not None
        n = cm.shapes.num_layers * len(cm.layer_kernels(sh, sh.num_tokens, False)) + 2
        out.append({"shape": sh.to_json(), "wall_s": cm.predict(sh).executor_s,
                    "issue_s": None if graph else HOST.launch_s * n})
    return out


def test_fit_recovers_the_host_parameters_that_made_the_steps():
    calib = fit_calibration(raw_measurements(synthetic_steps()))
    h = calib.host
    assert math.isclose(h.launch_s, HOST.launch_s, rel_tol=1e-9)
    assert h.graph_s == pytest.approx(HOST.graph_s, rel=1e-4)
    assert h.graph_s_per_req == pytest.approx(HOST.graph_s_per_req, rel=1e-3)
    assert h.eager_s == pytest.approx(HOST.eager_s, rel=1e-3)
    assert h.eager_s_per_req == pytest.approx(HOST.eager_s_per_req, rel=1e-2)
    assert calib.fit_report["steps"]["step_mape_all"] < 1e-6


def test_fit_of_copies_prefill_and_loop():
    calib = fit_calibration(raw_measurements(synthetic_steps()))
    assert calib.copy_out.alpha_s_per_byte == pytest.approx(1 / 20e9, rel=1e-6)
    assert calib.copy_out.beta_s == pytest.approx(30e-6, rel=1e-6)
    assert calib.copy_in.alpha_s_per_byte == pytest.approx(1 / 25e9, rel=1e-6)
    assert calib.attn_prefill.s == pytest.approx(5e-6, rel=1e-4)
    assert calib.loop.seconds(64, 64) == pytest.approx(150e-6 + 12e-6 * 64, rel=1e-6)


def test_round_trip_through_json(tmp_path):
    calib = fit_calibration(raw_measurements(synthetic_steps()))
    calib.save(tmp_path / "c.json")
    again = Calibration.load(tmp_path / "c.json")
    assert again.host == calib.host and again.gemm == calib.gemm
    assert again.attn_decode_graph == calib.attn_decode_graph


def test_launch_cost_is_found_from_wall_times_alone():
    """Serving steps carry no issue times: the launch cost comes from a grid search."""
    steps = [dict(s, issue_s=None) for s in synthetic_steps(seed=3)]
    calib = fit_calibration(dict(raw_measurements(steps), serving_steps=steps))
    assert calib.fit_report["host_fitted_on"] == "serving steps"
    assert calib.fit_report["steps"]["launch_from"] == "grid search on walls"
    assert calib.host.launch_s == pytest.approx(HOST.launch_s, abs=0.5e-6)
    assert calib.fit_report["steps"]["step_mape_eager"] < 0.01


def test_the_loop_is_fitted_to_the_serving_trace_gaps_when_recorded():
    # Gaps of 80 us + 20 us a scheduled request after each step, the bench loop's idle waits
    # (over 20 ms) among them: the fit recovers the line and leaves the waits out.
    steps = synthetic_steps()
    for i, st in enumerate(steps):
        n = StepShape.from_json(st["shape"]).num_reqs
        st["loop_s"] = 0.5 if i % 7 == 3 else 80e-6 + 20e-6 * n
    steps[-1]["loop_s"] = None
    raw = raw_measurements(synthetic_steps())
    raw["serving_steps"] = steps
    calib = fit_calibration(raw)
    assert calib.fit_report["loop_fitted_on"] == "serving steps"
    assert calib.loop.seconds(100, 100) == pytest.approx(80e-6 + 20e-6 * 100, rel=1e-3)
    # without recorded gaps the simulated loop's measurement stands
    assert fit_calibration(raw_measurements(synthetic_steps())).fit_report[
        "loop_fitted_on"] == "the simulated engine's loop"


@pytest.mark.parametrize("mark", ["meta", "gaps"])
def test_an_asynchronous_serving_trace_is_not_fitted_to(mark):
    """Under async scheduling a step's wall runs from its launch to its result, across the
    next step's launch: the fit refuses such walls (flagged in the meta, or shown by
    overlapping records' negative gaps) and fits the sweep steps when asked to."""
    sweep = synthetic_steps()
    slow = [dict(st, wall_s=3 * st["wall_s"], loop_s=-1e-3 if mark == "gaps" else 1e-4)
            for st in synthetic_steps(seed=5)]
    raw = dict(raw_measurements(sweep), serving_steps=slow)
    if mark == "meta":
        raw["meta"] = dict(raw["meta"], async_scheduling=True)
    with pytest.raises(ValueError, match="--host-steps sweep"):
        fit_calibration(raw)
    calib = fit_calibration(raw, host_source="sweep")
    assert calib.fit_report["host_fitted_on"] == "sweep steps"
    assert calib.fit_report["loop_fitted_on"] == "the simulated engine's loop"
    assert calib.host.graph_s == pytest.approx(HOST.graph_s, rel=1e-4)


def test_graph_steps_longest_context_tail_is_fitted():
    # Graph steps whose contexts are uneven (longest > mean) took 30 ns a layer per token
    # of the difference longer than their grid point: the fit finds that and leaves the
    # per-request term where the synthetic host put it.
    from dataclasses import replace

    tail_s = 30e-9
    cm = CostModel(model_config(), get_hardware("h200"), replace(calibration(), host=replace(
        HOST, graph_s_per_tail_token=tail_s)),
        CostModelConfig(block_bytes=raw_measurements()["meta"]["block_bytes"]))
    rng = random.Random(1)
    steps = []
    for b in (2, 5, 9, 16, 30, 48, 64, 100, 128, 200, 256, 12, 40, 90):
        mean = rng.randint(100, 900)
        longest = mean + rng.randint(0, 2000)
        sh = StepShape(b, b * mean, longest, (), b)
        assert cm.graph_batch(sh) is not None
        steps.append({"shape": sh.to_json(), "wall_s": cm.predict(sh).executor_s, "issue_s": None})
    calib = fit_calibration(raw_measurements(synthetic_steps() + steps))
    assert calib.host.graph_s_per_tail_token == pytest.approx(tail_s, rel=1e-3)
    assert calib.host.graph_s_per_req == pytest.approx(HOST.graph_s_per_req, rel=1e-2)
