"""eLLM's per-step recompute budget: the ridge rule, the cost model's price, and which one
an engine gets."""

from __future__ import annotations

import pytest

from kvtier.config import ConfigError
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.costmodel.shape import StepShape
from kvtier.engine.args import EngineArgs
from kvtier.policies.ellm import with_step_budget
from kvtier.policies.ellm.planner.step_budget import (
    CostBudget,
    FixedBudget,
    RidgeBudget,
    ridge_tokens,
)
from tests.policies.ellm.planner.test_request_level import M13

CALIB = "results/calibration/calib_h200_llama-2-13b.json"


def test_ridge_budget_is_the_ridge_point_minus_the_decodes_in_whole_blocks():
    ridge = ridge_tokens(get_hardware("h200"))
    assert 179 < ridge < 180  # 761 TFLOP/s over 4.24 TB/s
    budget = RidgeBudget(ridge, block_size=16, cap=4096)
    for b in range(0, 300):
        assert budget.tokens(b, 512) == max(0, 179 - b) // 16 * 16
    assert [budget.tokens(b, 0) for b in (0, 128, 163, 164, 200)] == [176, 48, 16, 0, 0]
    assert RidgeBudget(ridge, block_size=16, cap=32).tokens(0, 0) == 32  # the hard cap


def _cost_model(max_num_seqs=256):
    return CostModel(M13, get_hardware("h200"), Calibration.load(CALIB),
                     CostModelConfig(max_num_seqs=max_num_seqs, piecewise_graphs=True))


@pytest.mark.parametrize("b", [1, 16, 64, 128, 160, 192, 256])
def test_cost_budget_grows_the_step_by_at_most_the_tolerance(b):
    cm, ctx, tol = _cost_model(), 512, 0.01
    budget = CostBudget(cm, block_size=16, cap=256, tolerance=tol)
    k = budget.tokens(b, ctx + 100)  # contexts round down to a power of two
    base = cm.predict(StepShape(b, b * ctx, ctx, (), b)).total_s

    def grown(tokens: int) -> float:
        rows = ((16, 0),) * (tokens // 16)
        return cm.predict(StepShape(b, b * ctx, ctx, rows, b)).total_s / base - 1

    assert k % 16 == 0 and 0 <= k <= 256
    assert all(grown(j) <= tol for j in range(16, k + 1, 16))
    if k < 256:
        assert grown(k + 16) > tol  # the first block past the budget costs more


def test_cost_budget_prices_the_lost_decode_graph():
    # Below ~150 decodes the graph -> piecewise switch alone exceeds 1 %: nothing is free,
    # although the roofline would carry 179 - b tokens.
    budget = CostBudget(_cost_model(), block_size=16, cap=256, tolerance=0.01)
    for b in (1, 16, 64, 128):
        assert budget.tokens(b, 400) == 0
        assert RidgeBudget(ridge_tokens(get_hardware("h200")), 16, 256).tokens(b, 400) > 0
    assert budget.tokens(0, 0) == 0


def _config(**kw):
    return EngineArgs(model="llama-2-13b", load_format="dummy", kv_policy="ellm",
                      max_model_len=2048, **kw).create_engine_config()


def test_auto_prices_with_a_calibration_else_ridge_when_eager_else_nothing():
    cm = _cost_model()
    assert isinstance(with_step_budget(_config(), cost_model=cm).policy_options.step_budget,
                      CostBudget)
    eager = with_step_budget(_config(), decode_graphs=False).policy_options.step_budget
    assert isinstance(eager, RidgeBudget) and eager.tokens(100, 0) == 64
    graphs = with_step_budget(_config(), decode_graphs=True).policy_options.step_budget
    assert graphs == FixedBudget(0)
    uncalibrated = CostModel(M13, get_hardware("h200"), None, CostModelConfig())
    assert with_step_budget(_config(), cost_model=uncalibrated, decode_graphs=True
                            ).policy_options.step_budget == FixedBudget(0)


def test_explicit_rules():
    assert with_step_budget(_config(ellm_recompute_budget="max")).policy_options.step_budget \
        == FixedBudget(4096)  # not priced: the cap is half the step's 8192 tokens
    assert with_step_budget(_config(ellm_recompute_budget="64")).policy_options.step_budget \
        == FixedBudget(64)
    ridge = with_step_budget(_config(ellm_recompute_budget="ridge"), decode_graphs=True)
    assert isinstance(ridge.policy_options.step_budget, RidgeBudget)  # asked for: no switch
    with pytest.raises(ConfigError, match="needs --ellm-calibration"):
        with_step_budget(_config(ellm_recompute_budget="cost"))
    with pytest.raises(ConfigError, match="recompute_budget"):
        _config(ellm_recompute_budget="free")
    # Not ellm: untouched.
    other = EngineArgs(model="llama-2-13b", load_format="dummy").create_engine_config()
    assert getattr(with_step_budget(other).policy_options, "step_budget", None) is None


def test_priced_budgets_shrink_the_recompute_scratch():
    assert _config().policy_options.max_recompute_tokens == 256
    assert _config(ellm_recompute_budget="max").policy_options.max_recompute_tokens == 4096
    assert _config(ellm_uncached_ratio=0.3).policy_options.max_recompute_tokens == 4096
    assert _config(ellm_max_recompute_tokens=1024).policy_options.max_recompute_tokens == 1024


def test_cli_flags():
    import argparse

    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    ns = p.parse_args(["llama-2-13b", "--kv-policy", "ellm", "--ellm-recompute-budget", "32",
                       "--ellm-planner-calibration", CALIB])
    args = EngineArgs.from_cli_args(ns)
    assert args.ellm_calibration == CALIB  # the old spelling still works
    assert args.create_engine_config().policy_options.recompute_budget == 32
    ns = p.parse_args(["llama-2-13b", "--ellm-calibration", CALIB])
    assert EngineArgs.from_cli_args(ns).ellm_recompute_budget == "auto"
