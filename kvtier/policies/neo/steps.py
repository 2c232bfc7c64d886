"""NEO's three ways of running a step whose running requests include CPU decodes, and their
prices (torch-free: the policy chooses by them, the simulator prices the plan by them):

  * sequential: one batch; per layer the GPU waits in place for the CPU attention,

        T = T_gpu(all rows) + T_cdec

  * pipelined: batch 1 (the CPU decodes) and batch 0 (the rest) as two sub-batches; per layer
    batch 1's CPU attention runs under batch 0's whole layer on the GPU (neo/pipelined.py),
    and batch 1's linear layers around it cannot overlap it:

        T = T_linear(b1) + max(T_gpu(b0), T_cdec) + layers x T_launch

  * GPU-only: batch 0 alone; the CPU decodes sit the step out (NEO's scheduler runs this
    when pipelining does not pay, kvtier/policies/neo/modes.py), T = T_gpu(b0).

T_gpu(all rows) prices a CPU decode on the GPU as a decode of context 1: its linear layers
run there, its attention does not. T_cdec: the CPU attention's price (`price_cpu_rows`);
T_launch: NEO's predictor's launch constant (lnch_T), charged per layer as NEO's predictor
charges it: what splitting a layer into two sub-batches costs beyond their kernels (the H200's
pipelined steps took about that a layer beyond their price without it,
results/calibration/host_rows_h200.json, `pipelined_launch`).
A plan marks the way it chose with one item (SequentialCpuDecodes, PipelinedCpuDecodes:
their count is batch 1's rows), whose step hook prices the step the same way.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from kvtier.core.items import PlanItem
from kvtier.costmodel.hardware import HostAttention
from kvtier.costmodel.shape import StepShape
from kvtier.policies.host_resident import kv_bytes_per_token
from kvtier.policies.host_resident.balance import forward_s

LAUNCH_S = 0.8e-3  # NEO's lnch_T, a layer (NEO-MLSys25/NEO's predictor)
CPU_ROWS_KIND = "neo_cpu_rows"  # CpuRowsItem's kind: its count is the rows' context tokens
_GPU_FORWARD_PARTS = ("forward", "layers", "head", "attn_tail")  # by the cost model's path


class StepMode(str, enum.Enum):
    SEQUENTIAL = "sequential"
    PIPELINED = "pipelined"
    GPU_ONLY = "gpu_only"


@dataclass(frozen=True, slots=True)
class SequentialCpuDecodes(PlanItem):
    """Marks a step that runs its CPU decodes in one batch with the rest."""

    kind = "neo_sequential"
    num_rows: int  # the step's leading rows, its CPU decodes

    @property
    def count(self) -> int:
        return self.num_rows


@dataclass(frozen=True, slots=True)
class GraphedCpuDecodes(SequentialCpuDecodes):
    """Marks a sequential decode-only step that replays a decode graph (neo/graph_rows.py):
    its CPU decodes priced as such steps cost (HostAttention.CPU_GRAPH)."""

    kind = "neo_graphed"


@dataclass(frozen=True, slots=True)
class PipelinedCpuDecodes(SequentialCpuDecodes):
    """Marks a step that runs its CPU decodes as batch 1 of two pipelined sub-batches."""

    kind = "neo_pipelined"


def replays_a_graph(shape: StepShape) -> bool:
    """Whether the runner replays the step as a decode graph (under --neo-graphs): decodes
    only, every row sampling."""
    return not shape.prefills and shape.num_sampled == shape.num_decodes


def price_cpu_rows(cost_model, num_context_tokens: int,
                   mechanism: HostAttention = HostAttention.CPU_ROUND_TRIP) -> float:
    """The CPU reads every context token's K and V of every layer once a step; per layer
    q/k/v go down and the output comes back, a round trip the profile prices per layer
    (CPU_GRAPH: inside a replayed decode graph, through pinned flags)."""
    cost = cost_model.hw.host_attention_cost(mechanism)
    return cost.seconds(num_context_tokens * kv_bytes_per_token(cost_model),
                        cost_model.mc.num_layers)


def batch0(shape: StepShape, num_rows: int, host_tokens: int) -> StepShape:
    """The step without its CPU decodes (its leading `num_rows` decodes, `host_tokens` of
    context): what a GPU-only step runs. The longest context is kept (an upper bound)."""
    decodes = shape.num_decodes - num_rows
    return replace(shape, num_decodes=decodes, decode_ctx_sum=shape.decode_ctx_sum - host_tokens,
                   decode_ctx_max=shape.decode_ctx_max if decodes else 0,
                   num_sampled=max(0, shape.num_sampled - num_rows))


def linear_only(num_rows: int) -> StepShape:
    """`num_rows` decodes through the GPU's linear layers (context 1: no attention to speak
    of), sampling nothing: batch 1 on the GPU."""
    return StepShape(num_decodes=num_rows, decode_ctx_sum=num_rows, decode_ctx_max=1)


@dataclass(frozen=True)
class StepPrices:
    """Prices a step's ways of running (step shapes from StepShape or `forecast`)."""

    cost_model: Any  # kvtier.costmodel.CostModel
    launch_s: float = LAUNCH_S
    graphs: bool = False  # sequential decode-only steps replay a decode graph (--neo-graphs)

    def cost(self, shape: StepShape, num_rows: int, host_tokens: int, mode: StepMode):
        """The StepCost of `shape` (its leading `num_rows` decodes on the CPU, `host_tokens`
        of context, its items those of the step but the CPU rows' own) run as `mode`."""
        cm = self.cost_model
        if mode is StepMode.GPU_ONLY or not num_rows:
            return cm.predict(batch0(shape, num_rows, host_tokens))
        gpu = cm.predict(replace(shape, decode_ctx_sum=shape.decode_ctx_sum - host_tokens
                                 + num_rows))
        cpu = price_cpu_rows(cm, host_tokens)
        parts = dict(gpu.parts)
        if mode is StepMode.SEQUENTIAL:
            if self.graphs and replays_a_graph(shape):
                cpu = price_cpu_rows(cm, host_tokens, HostAttention.CPU_GRAPH)
            parts["items"] = parts.get("items", 0.0) + cpu
            return replace(gpu, executor_s=sum(parts.values()), parts=parts)
        # The GPU path of both sub-batches (run eagerly), and what of the CPU path sticks out.
        b0 = forward_s(cm, replace(batch0(shape, num_rows, host_tokens), items=()))
        for k in _GPU_FORWARD_PARTS:
            parts.pop(k, None)
        parts["forward"] = forward_s(cm, linear_only(num_rows)) + b0
        launch = self.launch_s * cm.mc.num_layers
        parts["items"] = parts.get("items", 0.0) + launch + max(0.0, cpu - b0)
        return replace(gpu, executor_s=sum(parts.values()), parts=parts, graph=False,
                       piecewise=False)

    def seconds(self, shape: StepShape, num_rows: int, host_tokens: int,
                mode: StepMode) -> float:
        return self.cost(shape, num_rows, host_tokens, mode).total_s


def _priced_step(kind: str, mode: StepMode, graphs: bool = False):
    def price(cost_model, shape: StepShape):
        counts = dict(shape.items)
        num_rows, host_tokens = counts[kind], counts.get(CPU_ROWS_KIND, 0)
        rest = tuple((k, n) for k, n in shape.items if k not in _MARKS)
        return StepPrices(cost_model, graphs=graphs).cost(replace(shape, items=rest),
                                                          num_rows, host_tokens, mode)
    return price


_MARKS = (CPU_ROWS_KIND, SequentialCpuDecodes.kind, GraphedCpuDecodes.kind,
          PipelinedCpuDecodes.kind)
price_sequential_step = _priced_step(SequentialCpuDecodes.kind, StepMode.SEQUENTIAL)
price_graphed_step = _priced_step(GraphedCpuDecodes.kind, StepMode.SEQUENTIAL, graphs=True)
price_pipelined_step = _priced_step(PipelinedCpuDecodes.kind, StepMode.PIPELINED)
