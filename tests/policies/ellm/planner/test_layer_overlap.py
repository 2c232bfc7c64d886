"""eLLM's choice of which layer groups of a dropped prefix to copy in and which to recompute:
hand-computed times, the balance point, and the engine option."""

import pytest

from kvtier.config import ConfigError
from kvtier.costmodel.hardware import CopyMechanism, get_hardware
from kvtier.engine.args import EngineArgs
from kvtier.model.loader import resolve_model_config
from kvtier.policies.ellm.planner.layer_overlap import (
    choose_host_groups,
    layer_params,
    overlap_configs,
)


def test_times_by_hand_for_llama_2_13b():
    mc, _ = resolve_model_config("llama-2-13b", "dummy")
    hw = get_hardware("h200")
    s, f = 64, 4  # 10 groups of 4 layers
    p = 5120 * (3 * 5120) + 5120 * 5120 + 3 * 5120 * 13824
    assert layer_params(mc) == p
    configs = overlap_configs(mc, hw, f, s)
    assert [c.host_groups for c in configs] == list(range(10))
    link = hw.h2d[CopyMechanism.BULK]
    for c in configs:
        h = c.host_groups
        assert c.recompute_s == pytest.approx(s * 2 * p * f * (10 - h) / hw.bf16_flops)
        want = (s * 2 * 5120 * 2 * f * h * link.alpha_s_per_byte + h * 4 * link.beta_s) if h else 0
        assert c.copy_s == pytest.approx(want)


def test_choice_is_where_the_two_times_cross():
    mc, _ = resolve_model_config("llama-2-13b", "dummy")
    hw = get_hardware("h200")
    configs = overlap_configs(mc, hw, 4, 256)
    best = choose_host_groups(mc, hw, 4, 256)
    assert best.step_s == min(c.step_s for c in configs)
    # Recompute falls and copying grows with h: the best split sits at their crossing.
    h = best.host_groups
    assert configs[h - 1].recompute_s > configs[h - 1].copy_s
    assert h + 1 == len(configs) or configs[h + 1].copy_s > configs[h + 1].recompute_s
    assert best.step_s < configs[0].step_s / 2  # much cheaper than recomputing every group


def test_engine_option_auto_and_errors():
    cfg = EngineArgs(model="llama-2-13b", load_format="dummy", kv_policy="ellm",
                     ellm_host_groups="auto").create_engine_config()
    mc, _ = resolve_model_config("llama-2-13b", "dummy")
    assert cfg.policy_options.prefix_host_groups == choose_host_groups(
        mc, get_hardware("h200"), 4).host_groups > 0
    other = EngineArgs(model="llama-2-13b", load_format="dummy", ellm_host_groups="auto"
                       ).create_engine_config().policy_options  # not ellm: no host groups
    assert getattr(other, "prefix_host_groups", 0) == 0
    with pytest.raises(ConfigError, match="ellm-host-groups"):
        EngineArgs(model="llama-2-13b", load_format="dummy",
                   ellm_host_groups="some").create_engine_config()


def test_priced_choice_is_the_cheapest_predicted_step():
    from kvtier.costmodel.shape import StepShape
    from kvtier.policies.ellm.planner.layer_overlap import choose_host_groups_priced
    from kvtier.sim.engine import build_sim_engine

    # The simulated engine's cost model: the runner's settings (F = 4, piecewise graphs).
    eng = build_sim_engine(EngineArgs(model="llama-2-13b", load_format="dummy",
                                      kv_policy="ellm", ellm_host_groups="auto"), "h200",
                           "results/calibration/calib_h200_llama-2-13b.json")
    cm = eng.executor.cost_model
    h = choose_host_groups_priced(cm, 10)
    assert eng.config.policy_options.prefix_host_groups == h

    def step(h: int) -> float:
        return cm.predict(StepShape(64, 64 * 400, 400, ((256, 0),), 64,
                                    num_prefix_rows=1 if h else 0, prefix_host_groups=h,
                                    num_prefix_copy_blocks=16 * h)).executor_s

    assert step(h) == min(step(g) for g in range(10))
    assert step(h) < step(0)  # copying beats recomputing every group
