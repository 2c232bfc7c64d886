"""Tensor parallelism over the GPUs of one host (docs/TENSOR_PARALLEL.md).

`sharding` (which rows, heads and vocabulary entries a rank holds) imports no torch: the
cost model prices a TP step with the same rule. The rest holds tensors or processes:
`parallel_state` (the process group), `layers` (the sharded model), `loading` (weights
sharded at load time), `factory` / `worker` / `executor` / `launch` (one process per rank,
the plan sent from the driver each step).
"""
