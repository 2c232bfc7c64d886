"""The round-robin backlog: one prompt per call in turn; discarded prompts never come out."""

from __future__ import annotations

from kvtier.sampling_params import SamplingParams
from kvtier.server.admission import RoundRobinBacklog

PARAMS = SamplingParams(max_tokens=1)


def _drain(backlog: RoundRobinBacklog) -> list[str]:
    out = []
    while (item := backlog.take()) is not None:
        out.append(item.request_id)
    return out


def test_calls_take_turns():
    backlog = RoundRobinBacklog()
    backlog.add([(f"big-{i}", [1]) for i in range(4)], PARAMS, None)
    assert backlog.take().request_id == "big-0"
    backlog.add([("small-0", [2])], PARAMS, None)
    backlog.add([("mid-0", [3]), ("mid-1", [3])], PARAMS, None)
    assert len(backlog) == 6
    assert _drain(backlog) == ["big-1", "small-0", "mid-0", "big-2", "mid-1", "big-3"]
    assert len(backlog) == 0


def test_discard_drops_prompts_and_empty_calls():
    backlog = RoundRobinBacklog()
    a = backlog.add([("a-0", [1]), ("a-1", [1]), ("a-2", [1])], PARAMS, None)
    backlog.add([("b-0", [2])], PARAMS, None)
    backlog.discard(["a-1", "unknown"])
    assert sorted(backlog.request_ids()) == ["a-0", "a-2", "b-0"]
    backlog.discard_call(a)
    assert _drain(backlog) == ["b-0"]


def test_the_lowest_priority_value_takes_its_turns_first():
    backlog = RoundRobinBacklog()
    backlog.add([(f"bulk-{i}", [1]) for i in range(3)], PARAMS, None, priority=5)
    assert backlog.take().request_id == "bulk-0"
    backlog.add([("urgent-0", [2]), ("urgent-1", [2])], PARAMS, None, priority=-1)
    backlog.add([("other-0", [3])], PARAMS, None, priority=-1)
    backlog.discard(["other-0"])  # gone before its turn: its priority leaves with it
    backlog.add([("next-0", [4])], PARAMS, None, priority=0)
    assert _drain(backlog) == ["urgent-0", "urgent-1", "next-0", "bulk-1", "bulk-2"]
    assert len(backlog) == 0
