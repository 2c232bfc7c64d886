"""eLLM's request-level planner: solve time and fit (CPU); results in results/planner/."""
