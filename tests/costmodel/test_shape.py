"""A plan's shape counts what the runner will run, eLLM's recomputed prefixes included."""

from kvtier.core.plan import RecomputePrefix, ScheduledRequest, StepPlan
from kvtier.costmodel.shape import StepShape
from kvtier.sampling_params import SamplingParams

P = SamplingParams()


def test_dropped_prefix_counts_as_a_prefill_row():
    plan = StepPlan(scheduled=[
        ScheduledRequest("a", [5], 99, ((),), False, True, P, 3),
        ScheduledRequest("b", [6], 49, ((),), False, True, P, 3),
        ScheduledRequest("c", [7] * 10, 0, ((1,),), True, True, P, 0),
    ], items=[RecomputePrefix("a", [1] * 32)])
    shape = StepShape.from_plan(plan)
    assert shape.num_decodes == 2 and shape.decode_ctx_sum == 100 + 50
    assert sorted(shape.prefills) == [(10, 0), (32, 0)]
    assert shape.num_tokens == 2 + 10 + 32 and shape.num_sampled == 3
