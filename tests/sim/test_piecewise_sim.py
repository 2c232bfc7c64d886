"""The simulator prices steps with prefill rows as piecewise-graph steps exactly when the
engine config has piecewise graphs on (and the runner would capture them)."""

from kvtier.costmodel.shape import StepShape
from kvtier.engine.args import EngineArgs
from kvtier.sim import build_sim_engine

MIXED = StepShape(num_decodes=3, decode_ctx_sum=1500, decode_ctx_max=600,
                  prefills=((527, 100),), num_sampled=4)


def cost_model(**kw):
    args = EngineArgs(model="llama-2-13b", load_format="dummy", max_model_len=4096,
                      num_gpu_blocks=4000, **kw)
    return build_sim_engine(args, "h200").executor.cost_model


def test_piecewise_graphs_follow_the_engine_config():
    on = cost_model(piecewise_graphs=True, max_num_batched_tokens=4096)
    assert on.config.piecewise_graphs and on.config.max_num_batched_tokens == 4096
    assert on.predict(MIXED).piecewise and on.piecewise_size(MIXED) == 544
    off = cost_model(piecewise_graphs=False)
    assert not off.config.piecewise_graphs and not off.predict(MIXED).piecewise
    # No CUDA graphs (enforce_eager): no pieces either.
    assert not cost_model(piecewise_graphs=True, enforce_eager=True).predict(MIXED).piecewise
    # HCache: pieces for every step, no full decode graph (the runner's rule).
    hcache = cost_model(piecewise_graphs=True, kv_policy="hcache")
    assert hcache.predict(MIXED).piecewise and not hcache.config.decode_graphs
    assert hcache.graph_sizes == []

