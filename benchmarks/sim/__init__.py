"""Experiments on the simulator (CPU); results in results/sim/."""
