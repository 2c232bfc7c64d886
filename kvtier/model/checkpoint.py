"""A checkpoint's tensors, read lazily, under the unfused names the loaders place: a model
that stores q, k and v as one `qkv_proj` (Phi-3) or gate and up as one `gate_up_proj` has
each fused tensor handed over as its parts' row ranges, so one placement rule (by the
unfused HF names) serves every family, whole or sharded for tensor parallelism."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvtier.config import ConfigError, ModelConfig


class RowRange:
    """Rows [start, stop) of a lazy safetensors slice, itself indexed lazily: `[a:b]` and
    `[:]` read only those rows of the file."""

    def __init__(self, lazy: Any, start: int, stop: int) -> None:
        self.lazy, self.start, self.stop = lazy, start, stop

    def __getitem__(self, rows: slice) -> Any:
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"a fused tensor's part is indexed by a row range, got {rows!r}")
        a, b, _ = rows.indices(self.stop - self.start)
        return self.lazy[self.start + a:self.start + b]


def _parts(name: str, cfg: ModelConfig) -> list[tuple[str, int, int]] | None:
    """(unfused name, first row, end row) of each part of a fused tensor; None otherwise."""
    prefix, fused = name.rsplit(".", 2)[0], name.rsplit(".", 2)[1:]
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    if fused == ["qkv_proj", "weight"] or fused == ["qkv_proj", "bias"]:
        kind = fused[1]
        return [(f"{prefix}.q_proj.{kind}", 0, q), (f"{prefix}.k_proj.{kind}", q, q + kv),
                (f"{prefix}.v_proj.{kind}", q + kv, q + 2 * kv)]
    if fused == ["gate_up_proj", "weight"]:
        return [(f"{prefix}.gate_proj.weight", 0, inter),
                (f"{prefix}.up_proj.weight", inter, 2 * inter)]
    return None


def checkpoint_tensors(ckpt: Path, cfg: ModelConfig) -> Iterator[tuple[str, Any]]:
    """(HF tensor name, its lazy slice) of every tensor in the checkpoint's *.safetensors
    files, file by file; a fused tensor as its parts (RowRange)."""
    from safetensors import safe_open

    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors files in {str(ckpt)!r}")
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():
                lazy = st.get_slice(name)
                parts = _parts(name, cfg)
                if parts is None:
                    yield name, lazy
                    continue
                rows = lazy.get_shape()[0]
                if rows != parts[-1][2]:
                    raise ConfigError(f"{name}: {rows} rows, expected {parts[-1][2]}")
                for part, start, stop in parts:
                    yield part, RowRange(lazy, start, stop)
