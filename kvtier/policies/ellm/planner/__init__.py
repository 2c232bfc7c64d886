"""Planners that choose memory-policy parameters from the cost of a step."""
