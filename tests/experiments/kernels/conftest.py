"""The kernel tests' set-up (interpreter without CUDA, exact fp32, NaN-poisoned new tensors)
for the kernels kept in benchmarks/experiments/kernels/."""

from tests.kernels.conftest import poison_new_tensors  # noqa: F401
