"""Layer-level overlap of swap copies: the order copies and events are issued in, and which
event each layer's attention waits for, checked with a fake stream that logs every call."""

from contextlib import contextmanager

import pytest
import torch

from kvtier import LLM, SamplingParams
from kvtier.core.plan import BlockCopy
from kvtier.runner.swap_copies import InOrderStreams, SwapCopies

F, G = 2, 3  # layers per block, layer groups


class FakeStreams:
    """Logs begin/record/wait/join; copies run at once and log the value they move."""

    overlaps = True

    def __init__(self):
        self.log: list[tuple] = []
        self.on_copy = False
        self.n = 0

    def begin(self):
        self.log.append(("begin",))

    @contextmanager
    def copying(self):
        self.on_copy = True
        yield
        self.on_copy = False

    def record(self):
        assert self.on_copy, "events go on the copy stream"
        self.n += 1
        self.log.append(("record", self.n))
        return self.n

    def wait(self, event):
        self.log.append(("wait", event))

    def join(self):
        self.log.append(("join",))


class LoggingTensor:
    """A pool whose block views log the copies into them."""

    def __init__(self, name, streams):
        self.name, self.streams = name, streams

    def __getitem__(self, i):
        pool = self
        where = f"{i.start}:{i.stop}" if isinstance(i, slice) else i

        class Block:
            def copy_(self, src, non_blocking=False):
                assert pool.streams.on_copy, "copies go on the copy stream"
                pool.streams.log.append(("copy", f"{src.name}{src.i}->{pool.name}{where}"))

        b = Block()
        # a slice is a run of blocks moved by one copy (`copy_blocks`): "5:7"
        b.name, b.i = self.name, f"{i.start}:{i.stop}" if isinstance(i, slice) else i
        return b


def make():
    s = FakeStreams()
    return s, SwapCopies(s, G, F), LoggingTensor("gpu", s), LoggingTensor("host", s)


def test_swap_outs_first_then_swap_ins_group_by_group_with_one_event_each():
    s, sc, gpu, host = make()
    # Two requests' swap-ins, each group-major, interleaved across requests by the plan.
    swap_in = [BlockCopy(10, 1, 0), BlockCopy(11, 2, 2), BlockCopy(12, 3, 0),
               BlockCopy(13, 4, 2)]
    sc.issue(gpu, host, [BlockCopy(5, 50, 1)], swap_in)
    assert s.log == [
        ("begin",),
        ("copy", "gpu5->host50"),
        ("copy", "host10->gpu1"), ("copy", "host12->gpu3"), ("record", 1),  # group 0
        ("copy", "host11->gpu2"), ("copy", "host13->gpu4"), ("record", 2),  # group 2
    ]
    assert sc.has_swap_in and sc.pending
    s.log.clear()
    for layer in range(F * G):
        sc.wait_layer(layer)
        s.log.append(("attn", layer))
    # Group 0 waits for event 1, group 1 has no swap-ins (nothing new), group 2 for event 2.
    assert s.log == [("wait", 1), ("attn", 0), ("attn", 1), ("attn", 2), ("attn", 3),
                     ("wait", 2), ("attn", 4), ("attn", 5)]
    assert not sc.pending


def test_swap_outs_alone_gate_the_first_attention():
    # A block freed by a swap-out may be written by this step's kv_write in any group.
    s, sc, gpu, host = make()
    sc.issue(gpu, host, [BlockCopy(5, 50, 0), BlockCopy(6, 51, 2)], [])
    assert s.log == [("begin",), ("copy", "gpu5:7->host50:52"), ("record", 1)]
    assert not sc.has_swap_in
    s.log.clear()
    sc.wait_layer(0)
    sc.wait_layer(5)
    assert s.log == [("wait", 1)]


def test_swap_outs_with_later_group_swap_ins():
    s, sc, gpu, host = make()
    sc.issue(gpu, host, [BlockCopy(5, 50, 0)], [BlockCopy(10, 1, 1)])
    assert s.log[-3:] == [("record", 1), ("copy", "host10->gpu1"), ("record", 2)]
    s.log.clear()
    for layer in range(F * G):
        sc.wait_layer(layer)
    assert s.log == [("wait", 1), ("wait", 2)]


def test_wait_all_then_layers_wait_no_more():
    s, sc, gpu, host = make()
    sc.issue(gpu, host, [], [BlockCopy(10, 1, 0), BlockCopy(11, 2, 1)])
    s.log.clear()
    sc.wait_all()
    for layer in range(F * G):
        sc.wait_layer(layer)
    assert s.log == [("wait", 2)]


def test_next_step_joins_the_previous_copies_and_empty_steps_issue_nothing():
    s, sc, gpu, host = make()
    sc.issue(gpu, host, [BlockCopy(5, 50, 0)], [])  # a copy-only step: no forward waited
    s.log.clear()
    sc.issue(gpu, host, [], [])
    assert s.log == [("join",)]  # before this step reuses a block the copy still reads
    assert not sc.pending
    s.log.clear()
    sc.issue(gpu, host, [], [])
    sc.wait_layer(0)
    sc.wait_all()
    assert s.log == []


def test_in_order_streams_copy_on_the_spot():
    gpu = torch.arange(4.0).reshape(4, 1)
    host = torch.full((3, 1), -1.0)
    sc = SwapCopies(InOrderStreams(), 2, 1)
    sc.issue(gpu, host, [BlockCopy(3, 0, 1)], [BlockCopy(0, 1, 0)])  # block 3 out, then in at 1
    assert host[0].item() == 3.0 and gpu[1].item() == 3.0
    sc.wait_layer(0)
    sc.wait_layer(1)
    sc.wait_all()


@pytest.mark.parametrize("piecewise", [True, False])
def test_runner_waits_per_group_before_attention(piecewise):
    """Through the real engine on the CPU with fake streams in place of CUDA's: under
    preemption by swap, no layer's attention runs before the event of its group's swap-ins
    (and the swap-outs) was waited for, later groups wait later, and tokens stay exact."""
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5 + i, 17, 42, 99] * 3} for i in range(4)]
    opts = dict(load_format="dummy", attention_backend="torch", max_model_len=32,
                kv_policy="swap", num_gpu_blocks=48, layers_per_block=1, block_size=4,
                max_num_batched_tokens=24, piecewise_graphs=piecewise)
    ref_llm = LLM("tiny-llama-gqa", overlap_swap=False, **opts)
    ref = [o.outputs[0].token_ids for o in ref_llm.generate(prompts, sp)]

    llm = LLM("tiny-llama-gqa", **opts)
    runner = llm.engine.executor
    fake = FakeStreams()
    runner.copies.streams = fake  # real tensors: the copies themselves are not logged
    copies, attn = runner.copies, runner.attention
    orig = attn.forward
    layers_per_block = runner.layers_per_block
    split_steps = 0  # steps whose attention waited at more than one layer

    def checked(layer_idx, *a, **k):
        assert copies.waited >= copies.ready[layer_idx // layers_per_block]
        fake.log.append(("attn", layer_idx))
        return orig(layer_idx, *a, **k)

    attn.forward = checked
    orig_issue = copies.issue

    def issue(*a):
        nonlocal split_steps
        waits_at = {e[1] for e, nxt in zip(fake.log, fake.log[1:])
                    if e[0] == "wait" and nxt[0] == "attn"}
        split_steps += len(waits_at) > 1
        fake.log.clear()
        orig_issue(*a)

    copies.issue = issue
    outs = llm.generate(prompts, sp)
    llm.engine.check_integrity()
    assert [o.outputs[0].token_ids for o in outs] == ref
    stats = llm.engine.get_stats()
    assert stats.num_preemptions_total > 0
    assert split_steps > 0, "no step overlapped a later group's swap-ins with compute"


def test_swap_overlap_benchmark_runs_on_the_cpu(tmp_path):
    from benchmarks.policies.bench_swap_overlap import main

    out = tmp_path / "r.json"
    assert main(["--model", "tiny-llama-gqa", "--device", "cpu", "--cases", "2:32",
                 "--decodes", "2", "--decode-ctx", "32", "--layers-per-block", "2",
                 "--reps", "1", "--warmup", "0", "--out", str(out)]) == 0
    import json

    case = json.loads(out.read_text())["cases"][0]
    assert case["swap_in_blocks"] == 2 * 2 * 2  # requests x token blocks x groups
    assert {"step_overlap", "step_serial", "copies", "forward_piecewise"} <= set(case)


def test_ellm_overlap_benchmark_runs_on_the_cpu(tmp_path):
    from benchmarks.policies.bench_ellm_overlap import main

    out = tmp_path / "r.json"
    assert main(["--model", "tiny-llama-gqa", "--device", "cpu", "--cases", "2:32:64",
                 "--host-groups", "0,2,3", "--decodes", "2", "--layers-per-block", "1",
                 "--reps", "1", "--warmup", "0", "--out", str(out)]) == 0
    import json

    cases = json.loads(out.read_text())["cases"]
    assert [c["host_groups"] for c in cases] == [0, 2, 3]
    # requests x prefix blocks (32 tokens / 16) x copied groups; none when all recompute
    assert [c["copy_blocks"] for c in cases] == [0, 2 * 2 * 2, 2 * 2 * 3]
    assert {"overlap", "compute", "copies", "serial", "bubble_ms"} <= set(cases[1])


def test_copy_blocks_moves_runs_as_slices_and_equals_block_by_block_copies():
    import torch

    from kvtier.runner.swap_copies import copy_blocks

    src = torch.arange(20 * 6, dtype=torch.float32).reshape(20, 2, 3)
    # runs (3..5 -> 10..12), a lone pair, a run broken by a jump, a descending pair
    dst_ids = [10, 11, 12, 0, 4, 5, 7, 19, 18]
    src_ids = [3, 4, 5, 9, 14, 15, 16, 1, 2]
    got = torch.zeros(20, 2, 3)
    copy_blocks(got, src, dst_ids, src_ids)
    want = torch.zeros(20, 2, 3)
    for d, s in zip(dst_ids, src_ids):
        want[d] = src[s]
    assert torch.equal(got, want)
