"""generated-shared-prefix (SGLang's) and the prefix-sharing analysis."""

import argparse
from collections import Counter

import pytest

from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.cli import add_bench_parser, run_bench, workload_spec
from kvtier.bench.prepared import load_prepared
from kvtier.bench.request import AS_GIVEN, BenchRequest
from kvtier.bench.shared_prefix import SharedPrefixSpec, generated_shared_prefix
from kvtier.bench.sharing import prefix_sharing
from kvtier.bench.workload import Dataset, WorkloadSpec, build_workload

SPEC = SharedPrefixSpec(num_groups=3, prompts_per_group=4, system_prompt_len=40, question_len=7,
                        output_len=5)


def test_groups_share_their_system_prompt_token_for_token():
    reqs = generated_shared_prefix(SPEC, vocab_size=1000, seed=0)
    assert len(reqs) == 12 and {r.prompt_len for r in reqs} == {47}
    assert {r.output_len for r in reqs} == {5}
    groups = Counter(r.prompt_token_ids[:40] for r in reqs)
    assert sorted(groups.values()) == [4, 4, 4]
    assert len({r.prompt_token_ids[40:] for r in reqs}) == 12  # every question its own
    firsts = [r.prompt_token_ids[:40] for r in reqs]
    assert firsts != sorted(firsts, key=firsts.index)  # shuffled, not group after group
    assert generated_shared_prefix(SPEC, 1000, seed=0) == reqs
    assert generated_shared_prefix(SPEC, 1000, seed=1) != reqs


def test_sharing_counts_whole_blocks_of_earlier_prompts():
    reqs = generated_shared_prefix(SPEC, vocab_size=1000, seed=0)
    s = prefix_sharing(reqs, block_size=16)
    # Each group's first request misses; the 3 others reuse 2 whole blocks (32 of 40 tokens).
    assert sorted(s.shared_tokens) == [0] * 3 + [32] * 9
    assert s.shared_fraction == pytest.approx(9 * 32 / (12 * 47))
    assert s.to_dict()["num_requests_sharing"] == 9


def test_sharing_never_counts_the_last_token_or_a_gap():
    a = BenchRequest(tuple(range(32)), 1)
    same = BenchRequest(tuple(range(32)), 1)  # equal prompt: its last block is recomputed
    gap = BenchRequest((99,) * 16 + tuple(range(16, 32)), 1)  # block 1 equal, block 0 not
    assert prefix_sharing([a, same, gap], 16).shared_tokens == (0, 16, 0)
    with pytest.raises(ValueError):
        prefix_sharing([a], 0)


def test_workload_needs_exactly_its_requests():
    spec = WorkloadSpec(Dataset.GENERATED_SHARED_PREFIX, 12, ArrivalSpec(ArrivalKind.OFFLINE),
                        shared_prefix=SPEC, limits=AS_GIVEN)
    w = build_workload(spec, tokenizer=None, vocab_size=1000)  # type: ignore[arg-type]
    assert len(w.requests) == 12
    with pytest.raises(ValueError, match="3 x 4 = 12"):
        build_workload(WorkloadSpec(Dataset.GENERATED_SHARED_PREFIX, 10,
                                    ArrivalSpec(ArrivalKind.OFFLINE), shared_prefix=SPEC),
                       None, 1000)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gsp question_len"):
        SharedPrefixSpec(question_len=0)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    return parser.parse_args(["bench", "--model", "tiny-llama", "--load-format", "dummy", *argv])


GSP_ARGS = ("--workload", "generated-shared-prefix", "--gsp-num-groups", "2",
            "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "64",
            "--gsp-question-len", "8", "--gsp-output-len", "4")


def test_cli_flags_are_sglangs_and_set_the_count():
    spec = workload_spec(parse(*GSP_ARGS), max_model_len=256)
    assert spec.num_requests == 6 and spec.shared_prefix == SharedPrefixSpec(2, 3, 64, 8, 4)
    with pytest.raises(SystemExit, match="system_prompt_len"):
        workload_spec(parse("--gsp-system-prompt-len", "-1"), 256)


def test_saved_and_replayed_through_prepared(tmp_path):
    path = tmp_path / "gsp.json"
    assert run_bench(parse(*GSP_ARGS, "--save-workload", str(path), "--prepare-only")) == 0
    replayed = load_prepared(path, 6, AS_GIVEN)
    assert Counter(r.prompt_token_ids[:64] for r in replayed).most_common(1)[0][1] == 3
    assert prefix_sharing(replayed, 16).shared_tokens.count(64) == 4
