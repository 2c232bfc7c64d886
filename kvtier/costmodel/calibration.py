"""A calibration: what `kvtier profile` measured on one GPU for one model, fitted into the
pieces the cost model reads, plus the raw measurements (so fits can be redone on a CPU).

Operator curves are device times of one call (GEMMs, attention, a layer's elementwise
kernels) measured inside CUDA graphs, i.e. without host launch cost; the host parameters
are fitted from whole runner steps so that curves + host = the step's wall time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvtier.costmodel.curves import Curve, Grid
from kvtier.costmodel.hardware import CopyCost

CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class HostParams:
    """Host-side time of a runner step, beyond the device time of its operators."""

    # Decode-only steps replayed as a CUDA graph: batch building, input copies, replay
    # launch, in-graph kernel gaps.
    graph_s: float = 0.35e-3
    graph_s_per_req: float = 2e-6
    # Not host time but fitted with it: a graph step's decode attention past what its grid
    # point (the batch at the mean context) measured, per layer and per token that the
    # longest context runs past the mean. At graph batch sizes a request's context is one
    # program per KV head (one split from two waves of programs on, 14 requests of
    # llama-2-13b: `default_num_splits`), so the longest one finishes last, alone; the
    # profile's grid has uniform contexts. Fitting it lets graph_s_per_req fall to what a
    # graph step takes to issue (results/calibration/calib_h200_llama-2-13b.json).
    graph_s_per_tail_token: float = 0.0
    # Eager steps (prefill chunks present): inputs and metadata, then the forward is issued
    # kernel by kernel while the GPU runs behind; see `overlap.py`.
    eager_s: float = 0.6e-3
    eager_s_per_req: float = 3e-6
    eager_s_per_token: float = 0.05e-6
    launch_s: float = 8e-6  # host time to issue one kernel in eager mode
    # Piecewise CUDA graphs (steps with prefill rows, `EngineConfig.piecewise_graphs`): the
    # same input preparation (eager_s...), then per layer the eager attention's launches, the
    # copy of its output into the static buffer and one graph replay; see `CostModel`.
    # Defaults: the wrappers' host cost (results/kernels/launch_overhead_h200.json).
    replay_s: float = 10e-6  # one piece's graph replay (CUDAGraph.replay)
    attn_write_s: float = 45e-6  # the attention call up to kv_write, kv_write included
    attn_decode_s: float = 96e-6  # the split-K decode wrapper (kernel + merge of the splits)
    attn_prefill_s: float = 45e-6  # the varlen prefill wrapper
    op_launch_s: float = 10e-6  # one torch op (a copy into a static buffer, the embedding)
    # Host time per layer of a piecewise forward beyond those launches (the layer loop, the
    # static buffers' slices, the attention call's Python around its kernels): fitted to the
    # profiler's measured issue times of whole piecewise forwards; the launches, each timed
    # alone in a loop of its own, add up to less than what a forward takes.
    piece_layer_s: float = 0.0


@dataclass(frozen=True)
class LoopParams:
    """The engine loop outside the executor: schedule, update, outputs, the bench runner."""

    s: float = 0.2e-3
    s_per_req: float = 8e-6  # per scheduled request
    s_per_sampled: float = 10e-6  # per request that received a token (outputs built)

    def seconds(self, num_reqs: int, num_sampled: int) -> float:
        return self.s + self.s_per_req * num_reqs + self.s_per_sampled * num_sampled


@dataclass(frozen=True)
class PrefillFit:
    """Prefill attention per layer: s + s_per_flop * causal FLOPs + s_per_token * tokens."""

    s: float
    s_per_flop: float
    s_per_token: float

    def seconds(self, flops: float, tokens: int) -> float:
        return self.s + self.s_per_flop * flops + self.s_per_token * tokens


@dataclass(frozen=True)
class Calibration:
    hardware: str  # the HardwareProfile name it was measured on
    model: str
    model_dims: dict[str, int]  # hidden, layers, heads, kv_heads, inter, vocab: checked on load
    max_model_len: int  # decode graphs choose their splits from it
    gemm: dict[str, Curve]  # qkv, o, gate_up, down, lm_head: seconds per call over rows
    elementwise: Curve  # one layer's six elementwise kernels over tokens
    head_elementwise: Curve  # embedding + final norm over tokens
    sample: Curve  # fp32 cast, argmax and the host sync over sampled rows (wall time)
    attn_decode_graph: Grid  # per layer over (decode rows, mean context), graph splits
    attn_decode_eager: Grid  # per layer, splits chosen from the step's max context
    attn_prefill: PrefillFit
    host: HostParams
    loop: LoopParams
    copy_out: CopyCost  # the runner's swap-out path, affine summary: alpha*bytes + beta
    copy_in: CopyCost
    # What the cost model uses: measured seconds of one swap call over its block count (not
    # affine: small calls are dominated by their fixed costs). A calibration made before the
    # runner copied pinned pages, runs of blocks as one copy, holds that older path's times.
    copy_out_blocks: Curve | None = None
    copy_in_blocks: Curve | None = None
    memory: dict[str, float] = field(default_factory=dict)  # measured pool sizing inputs
    fit_report: dict[str, Any] = field(default_factory=dict)  # residuals of each fit
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    environment: dict[str, Any] = field(default_factory=dict)

    # ---- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": CALIBRATION_VERSION, "hardware": self.hardware, "model": self.model,
            "model_dims": self.model_dims, "max_model_len": self.max_model_len,
            "gemm": {k: c.to_json() for k, c in self.gemm.items()},
            "elementwise": self.elementwise.to_json(),
            "head_elementwise": self.head_elementwise.to_json(),
            "sample": self.sample.to_json(),
            "attn_decode_graph": self.attn_decode_graph.to_json(),
            "attn_decode_eager": self.attn_decode_eager.to_json(),
            "attn_prefill": asdict(self.attn_prefill), "host": asdict(self.host),
            "loop": asdict(self.loop), "copy_out": asdict(self.copy_out),
            "copy_in": asdict(self.copy_in),
            "copy_out_blocks": self.copy_out_blocks.to_json() if self.copy_out_blocks else None,
            "copy_in_blocks": self.copy_in_blocks.to_json() if self.copy_in_blocks else None,
            "memory": self.memory,
            "fit_report": self.fit_report, "environment": self.environment, "raw": self.raw,
        }

    @staticmethod
    def measured_curves(d: dict[str, Any]) -> dict[str, Any]:
        """The measured operator curves, as keyword arguments, from a calibration JSON or a
        profiler's raw measurements (the two share these keys)."""
        return dict(
            gemm={k: Curve.from_json(v) for k, v in d["gemm"].items()},
            elementwise=Curve.from_json(d["elementwise"]),
            head_elementwise=Curve.from_json(d["head_elementwise"]),
            sample=Curve.from_json(d["sample"]),
            attn_decode_graph=Grid.from_json(d["attn_decode_graph"]),
            attn_decode_eager=Grid.from_json(d["attn_decode_eager"]),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        if d.get("version") != CALIBRATION_VERSION:
            raise ValueError(f"calibration version {d.get('version')} != {CALIBRATION_VERSION}")
        return cls(
            hardware=d["hardware"], model=d["model"], model_dims=d["model_dims"],
            max_model_len=d["max_model_len"], **cls.measured_curves(d),
            attn_prefill=PrefillFit(**d["attn_prefill"]), host=HostParams(**d["host"]),
            loop=LoopParams(**d["loop"]), copy_out=CopyCost(**d["copy_out"]),
            copy_in=CopyCost(**d["copy_in"]),
            copy_out_blocks=_curve(d.get("copy_out_blocks")),
            copy_in_blocks=_curve(d.get("copy_in_blocks")), memory=d.get("memory", {}),
            fit_report=d.get("fit_report", {}), raw=d.get("raw", {}),
            environment=d.get("environment", {}),
        )

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _curve(rows: list | None) -> Curve | None:
    return Curve.from_json(rows) if rows else None


def model_dims(mc) -> dict[str, int]:
    return {"hidden": mc.hidden_size, "layers": mc.num_layers, "heads": mc.num_heads,
            "kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim,
            "inter": mc.intermediate_size, "vocab": mc.vocab_size}
