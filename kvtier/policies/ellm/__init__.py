"""eLLM adaptive KV caching: drop KV prefixes of running requests and recompute them each
step (policy.py), its flags and options (options.py), its assembly hooks: recompute
scratch, budget, planner (assembly.py, budgets.py), its planners (planner/)."""

from kvtier.policies.ellm.assembly import (
    EllmSystem,
    ellm_cost_model,
    recompute_scratch_blocks,
    with_priced_host_groups,
)
from kvtier.policies.ellm.budgets import with_planner, with_step_budget
from kvtier.policies.ellm.options import EllmArgs, EllmOptions, copied_groups_in_flight
from kvtier.policies.ellm.policy import EllmPolicy
from kvtier.policies.registry import register_system

register_system(EllmSystem)

__all__ = ["EllmArgs", "EllmOptions", "EllmPolicy", "EllmSystem", "copied_groups_in_flight",
           "ellm_cost_model", "recompute_scratch_blocks", "with_planner", "with_priced_host_groups",
           "with_step_budget"]
