"""Building a real engine: the one assembly (kvtier/engine/assembly.py) over the model
runner's factory. `LLMEngine.from_engine_args(args)` is the same call."""

from __future__ import annotations

from kvtier.engine.args import EngineArgs
from kvtier.engine.assembly import check_config, freeze_startup_objects
from kvtier.engine.llm_engine import LLMEngine

__all__ = ["build_engine", "check_config", "freeze_startup_objects"]


def build_engine(args: EngineArgs) -> LLMEngine:
    return LLMEngine.from_engine_args(args)
