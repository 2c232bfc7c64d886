"""What the event loop asks of the engine's worker thread (see async_engine.py)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.sampling_params import SamplingParams


@dataclass
class Add:
    prompts: Sequence[tuple[str, list[int]]]  # (request_id, prompt token ids)
    params: SamplingParams
    future: concurrent.futures.Future
    arrival_time: float | None = None  # on the engine's clock
    priority: int = 0  # --scheduling-policy priority's (lower first)


@dataclass
class Abort:
    request_ids: list[str]


@dataclass
class Call:
    fn: Callable[[Any], Any]
    future: concurrent.futures.Future


@dataclass
class Stop:
    pass


def run_into(future: concurrent.futures.Future, fn: Callable[[Any], Any], arg: Any) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(arg))
    except BaseException as exc:
        future.set_exception(exc)


def fail_future(future: concurrent.futures.Future, exc: BaseException) -> None:
    try:
        future.set_exception(exc)
    except concurrent.futures.InvalidStateError:  # cancelled or done meanwhile
        pass
