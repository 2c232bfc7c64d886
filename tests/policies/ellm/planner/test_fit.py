"""The planner's roofline fitted to the cost model predicts the cost model's decode steps."""

import numpy as np

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.policies.ellm.planner.fit import decode_shape, fit_to_cost_model, sample_points
from kvtier.policies.ellm.planner.request_level import PlannerConfig, RequestLevelPlanner
from tests.policies.ellm.planner.test_request_level import M13

CALIB = "results/calibration/calib_h200_llama-2-13b.json"


def _mape(planner: RequestLevelPlanner, rows) -> float:
    return float(np.mean([abs(planner.step_time(b, r, s) / t - 1) for b, s, r, t in rows]))


def test_recomputed_prefixes_are_prefill_rows():
    shape = decode_shape(4, 512, 0.25)
    assert shape.num_decodes == 4 and shape.prefills == ((128, 0),) * 4
    assert decode_shape(4, 512, 0.0).prefills == ()


def test_fit_follows_the_calibrated_cost_model():
    cm = CostModel(M13, get_hardware("h200"), Calibration.load(CALIB),
                   CostModelConfig(max_num_seqs=256, piecewise_graphs=True))
    cfg = PlannerConfig(hbm_bytes_per_s=4.24e12, bf16_flops=761e12, kv_budget_bytes=40 << 30,
                        tpot_slo_s=0.1)
    fitted = fit_to_cost_model(M13, cfg, cm)
    rows = sample_points(cm, cfg.max_batch, 8192)
    assert len(rows) > 20
    probe, fit = _mape(RequestLevelPlanner(M13, cfg), rows), _mape(RequestLevelPlanner(M13, fitted), rows)
    assert fit < 0.08 and fit < probe / 3
    assert 0 < fitted.flops_efficiency <= 1 and 0 < fitted.hbm_efficiency <= 1
    # Recomputing anything costs extra in the calibrated model (piecewise, not a full graph).
    assert fitted.recompute_overhead_s > 0


def test_the_real_engine_fits_its_planner_to_a_given_calibration():
    from kvtier.engine.args import EngineArgs
    from kvtier.policies.ellm import ellm_cost_model, with_planner

    args = EngineArgs(model="llama-2-13b", load_format="dummy", kv_policy="ellm",
                      ellm_planner=True, ellm_calibration=CALIB, max_model_len=2048)
    config = args.create_engine_config()
    cm = ellm_cost_model(config, args, config.cache.block_bytes(config.model_config, 2))
    planner = with_planner(config, args, 40 << 30, cost_model=cm).policy_options.planner
    assert planner is not None and planner.cfg.recompute_overhead_s > 0
    assert planner.cfg.flops_efficiency < 1.0


def test_a_calibration_of_another_model_is_refused(tmp_path):
    import pytest

    from kvtier.engine.args import EngineArgs
    from kvtier.engine.builder import build_engine
    from tests.hf_models import save_tiny_model

    path = save_tiny_model("llama-gqa", tmp_path)
    args = EngineArgs(model=str(path), dtype="float32", device="cpu", kv_policy="ellm",
                      ellm_planner=True, ellm_calibration=CALIB, max_model_len=128)
    with pytest.raises(ValueError, match="does not match"):
        build_engine(args)
