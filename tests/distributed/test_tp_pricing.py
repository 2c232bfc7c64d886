"""The simulator prices a tensor-parallel step with the runner's sharding: per-GPU shapes, the
layers' all-reduces, the vocab-parallel embedding's all-reduce and the logits' gather."""

from __future__ import annotations

import pytest

from kvtier.config import ConfigError
from kvtier.costmodel import CostModel, CostModelConfig, StepShape, get_hardware
from kvtier.engine.args import EngineArgs
from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.presets import PRESETS
from kvtier.sim import build_sim_engine

MC = model_config_from_hf(PRESETS["llama-3.1-8b"], name="llama-3.1-8b")


def _model(tp: int) -> CostModel:
    return CostModel(MC, get_hardware("h200"), None,
                     CostModelConfig(max_num_seqs=256, block_bytes=1 << 20, num_gpus=tp))


def test_head_collectives_are_priced_at_tp2():
    one, two = _model(1), _model(2)
    s = two.shapes
    head1, head2 = one.head_kernels(512, 64), two.head_kernels(512, 64)
    hw = get_hardware("h200")
    # embedding all-reduce: 2 (n-1)/n x bytes / bw; logits gather: (n-1)/n x bytes / bw
    embed_ar = 512 * s.hidden * 2 / hw.allreduce_bytes_per_s + hw.allreduce_latency_s
    gather = 0.5 * 64 * MC.vocab_size * 2 / hw.allreduce_bytes_per_s + hw.allreduce_latency_s
    assert head2[0] == pytest.approx(
        one.timer.head_elementwise(512, _head_elementwise_ops(two, 512)) + embed_ar, rel=1e-9)
    assert head2[1] > gather and head2[1] - gather < head1[1]  # half the LM head, plus the gather


def _head_elementwise_ops(cm: CostModel, tokens: int):
    from kvtier.costmodel.operators import head_ops

    return head_ops(cm.shapes, tokens, 0)[:2]


def test_decode_step_at_tp2_is_cheaper_but_not_half():
    shape = StepShape(num_decodes=64, decode_ctx_sum=64 * 1000, decode_ctx_max=1000,
                      num_sampled=64)
    t1, t2 = _model(1).predict(shape).executor_s, _model(2).predict(shape).executor_s
    assert 0.5 * t1 < t2 < t1


def test_sim_engine_takes_the_tp_size_from_the_engine_args():
    args = EngineArgs(model="llama-3.1-8b", load_format="dummy", max_model_len=4096,
                      tensor_parallel_size=2)
    assert build_sim_engine(args).executor.cost_model.shapes.tp == 2
    with pytest.raises(ConfigError, match="disagree"):
        build_sim_engine(args, num_gpus=4)
