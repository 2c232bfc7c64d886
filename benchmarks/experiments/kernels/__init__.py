"""Kernels the engine does not use, kept with their tests (tests/experiments/kernels/) for the
record of what they measured."""
