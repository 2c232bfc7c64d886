"""Full cache + preempt-swap (vLLM V0): the host pool the assembly sizes is its pool."""

from kvtier.policies.base import MemorySystem
from kvtier.policies.registry import register_system
from kvtier.policies.swap.policy import SwapPolicy


@register_system
class SwapSystem(MemorySystem):
    name = "swap"
    policy = SwapPolicy
    demo_order = 1


__all__ = ["SwapPolicy", "SwapSystem"]
