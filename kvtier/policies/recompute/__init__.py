"""Full cache + preempt-recompute (vLLM V1): nothing to assemble, no options."""

from kvtier.policies.base import MemorySystem
from kvtier.policies.recompute.policy import RecomputePolicy
from kvtier.policies.registry import register_system


@register_system
class RecomputeSystem(MemorySystem):
    name = "recompute"
    policy = RecomputePolicy
    demo_order = 0  # the baseline


__all__ = ["RecomputePolicy", "RecomputeSystem"]
