"""Admission past the device pool (kvtier/policies/host_resident/admission.py, NEO's CPU
prefills): the waiting prompts a step admits and the device blocks they need; the
placement moves the newest decodes out to make that room, never moves one in that the
prompts' room would send out again, and the engine's outputs hold with it (fp32, CPU)."""

from __future__ import annotations

import pytest

from kvtier.core.request import Request, RequestStatus
from kvtier.engine.args import EngineArgs
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.directkv import DirectKVOptions, DirectKVPolicy
from kvtier.policies.host_resident.admission import admitted_prompt_blocks
from kvtier.policies.host_resident.step_tokens import StepTokens
from kvtier.sampling_params import SamplingParams
from tests.policies.test_host_resident import running_decode
from tests.policies.test_host_resident_engine import run


def waiting(rid: str, prompt_len: int) -> Request:
    return Request(rid, list(range(100, 100 + prompt_len)), SamplingParams(max_tokens=4),
                   max_tokens=4)


def manager(**kw) -> KVCacheManager:
    # 2 layer groups, blocks of 4 tokens
    return KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=20, num_host_blocks=40,
                          watermark=0.0, **kw)


def test_the_prompts_admitted_are_counted_whole_within_the_budget_and_seats():
    kv = manager()
    running = [running_decode(kv, f"r{i}") for i in range(2)]  # 2 tokens of the budget
    queue = [waiting("w0", 9), waiting("w1", 8), waiting("w2", 4)]
    # 9 tokens: 3 blocks x 2 groups; 8 tokens: 2 x 2; the budget's 19 tokens end at w2.
    assert admitted_prompt_blocks(running, queue, kv, StepTokens(19), seats=8) == (0, 6 + 4)
    # Whole prompts even when chunked: w0's first chunk is all the budget has left.
    assert admitted_prompt_blocks(running, queue, kv, StepTokens(5), seats=8) == (0, 6)
    assert admitted_prompt_blocks(running, queue, kv, StepTokens(2), seats=8) == (0, 0)
    # Seats count the running requests.
    assert admitted_prompt_blocks(running, queue, kv, StepTokens(100), seats=3) == (0, 6)
    assert admitted_prompt_blocks(running, queue, kv, StepTokens(100), seats=8) == (0, 6 + 4 + 2)


def test_a_prefix_cache_hit_is_counted_too():
    """Blocks only the cache holds count as free room already (taken off them, the room
    would be counted twice)."""
    from kvtier.kv.prefix_cache import PrefixCacheConfig

    kv = manager(prefix_cache=PrefixCacheConfig())
    done = waiting("done", 9)
    kv.admit(done)
    assert kv.allocate_slots(done, 9) is not None
    kv.cache_full_blocks(done, 9)  # its 2 full blocks are cached, evictable once it ends
    kv.free(done)
    assert kv.num_available_gpu_blocks() == 20
    assert admitted_prompt_blocks([], [waiting("again", 9)], kv, StepTokens(100), seats=8) == (0, 6)


def test_the_prompts_admitted_follow_the_long_prefill_controls():
    """The scheduler caps a chunk at the threshold and lets one prefill stop part-way a
    step (vLLM's defaults): w1 would be a second partial prefill, so only w0 is admitted;
    a running prompt part-way takes that place first, and then no waiting prompt is."""
    from kvtier.scheduler.prefill_budget import PrefillChunker

    kv = manager()
    queue = [waiting("w0", 9), waiting("w1", 8), waiting("w2", 4)]

    def capped() -> StepTokens:
        return StepTokens(100, PrefillChunker(threshold=4, max_partial=1))
    assert admitted_prompt_blocks([], queue, kv, StepTokens(100), seats=8) == (0, 6 + 4 + 2)
    assert admitted_prompt_blocks([], queue, kv, capped(), seats=8) == (0, 6)
    two = StepTokens(100, PrefillChunker(threshold=4, max_partial=2))  # w2 fits whole
    assert admitted_prompt_blocks([], queue, kv, two, seats=8) == (0, 6 + 4 + 2)
    three = [waiting("x0", 9), waiting("x1", 8), waiting("x2", 5)]  # x2 a third partial
    two = StepTokens(100, PrefillChunker(threshold=4, max_partial=2))
    assert admitted_prompt_blocks([], three, kv, two, seats=8) == (0, 6 + 4)
    part = waiting("p", 20)
    kv.admit(part)
    assert kv.allocate_slots(part, 4) is not None
    part.num_computed_tokens = 4
    assert admitted_prompt_blocks([part], queue, kv, capped(), seats=8) == (2 * 4, 0)


def test_without_chunked_prefill_a_prompt_past_the_budget_is_not_counted():
    kv = manager()
    queue = [waiting("w0", 9)]
    assert admitted_prompt_blocks([], queue, kv, StepTokens(5), seats=8) == (0, 6)
    assert admitted_prompt_blocks([], queue, kv, StepTokens(5, chunked_prefill=False), seats=8) == (0, 0)
    assert admitted_prompt_blocks([], queue, kv, StepTokens(9, chunked_prefill=False), seats=8) == (0, 6)


def test_a_running_prompts_later_chunks_keep_their_room():
    kv = manager()
    part = waiting("p", 20)  # 5 blocks a group when whole
    assert kv.allocate_slots(part, 8) is not None  # its first chunk: 2 blocks a group
    part.num_computed_tokens = 8
    assert admitted_prompt_blocks([part], [], kv, StepTokens(100), seats=8) == (2 * 3, 0)


def test_room_is_made_for_a_waiting_prompt_by_moving_the_newest_decodes():
    kv = manager()
    running = [running_decode(kv, f"r{i}", prompt_len=7) for i in range(4)]  # 16 used
    policy = DirectKVPolicy(DirectKVOptions(max_model_len=64, max_step_tokens=64,
                                            host_admission=True))
    # The prompt needs 3 blocks x 2 groups, 4 are free: the newest decode's 4 make room.
    policy.before_step(running, kv, [waiting("w0", 12)])
    assert kv.host_running == {"r3"} and policy.num_moved_for_prompts == 1
    assert kv.gpu.num_free == 8
    kv.check_integrity()
    # Nothing waits: the host-running request comes back into the room.
    policy.before_step(running, kv, [])
    assert policy.num_moved_in > 0


def test_no_request_moves_in_into_the_room_a_waiting_prompt_needs():
    kv = manager()
    running = [running_decode(kv, f"r{i}", prompt_len=7) for i in range(4)]
    policy = DirectKVPolicy(DirectKVOptions(max_model_len=64, max_step_tokens=64,
                                            host_admission=True))
    policy.before_step(running, kv, [waiting("w0", 12)])
    host = set(kv.host_running)
    policy.before_step(running, kv, [waiting("w0", 12)])  # still waiting: it stays out
    assert kv.host_running == host and policy.num_moved_in == 0
    kv.check_integrity()


def test_no_decode_moves_unless_the_whole_room_can_be_made():
    """A host pool that takes one mover but not the two the prompt needs: none moves (the
    first would sit on the host for nothing while the prompt still waits)."""
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=20, num_host_blocks=8,
                        watermark=0.0)
    running = [running_decode(kv, f"r{i}", prompt_len=7) for i in range(4)]
    policy = DirectKVPolicy(DirectKVOptions(max_model_len=16, max_step_tokens=64,
                                            host_admission=True))
    policy.before_step(running, kv, [waiting("w0", 24)])  # 12 blocks: 2 movers' room
    assert not kv.host_running and policy.num_moved_out == 0 and policy.num_refused == 0
    kv.check_integrity()


def test_a_running_prompts_room_is_kept_when_a_new_prompts_cannot_be_made():
    """A chunked prompt whose room was made, and then a waiting prompt the host cannot make
    room for: the running prompt's room is not handed back to the host-running request
    (it would leave the prompt's later chunks short, and the scheduler would preempt it)."""
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=18, num_host_blocks=6,
                        watermark=0.0)
    running = [running_decode(kv, name, prompt_len=7) for name in ("r0", "r1", "h")]
    policy = DirectKVPolicy(DirectKVOptions(max_model_len=64, max_step_tokens=64,
                                            host_admission=True, swap_in_fraction=1.0))
    prompt = waiting("p", 16)
    policy.before_step(running, kv, [prompt])
    assert kv.host_running == {"h"}
    prompt.status = RequestStatus.RUNNING
    assert kv.allocate_slots(prompt, 4) is not None  # its first chunk
    prompt.num_computed_tokens = 4
    running.append(prompt)
    policy.before_step(running, kv, [])
    policy.before_step(running, kv, [waiting("w", 12)])  # no host room for w's movers
    assert kv.host_running == {"h"} and policy.num_moved_in == 0
    later = kv.num_groups * (4 - kv.tables["p"].num_token_blocks)
    assert kv.gpu.num_free >= later
    kv.check_integrity()


def test_off_the_prompts_wait_for_room():
    kv = manager()
    running = [running_decode(kv, f"r{i}", prompt_len=7) for i in range(4)]
    policy = DirectKVPolicy(DirectKVOptions(max_model_len=64))  # off by default
    policy.before_step(running, kv, [waiting("w0", 12)])
    assert not kv.host_running and policy.num_moved_for_prompts == 0


def test_the_flag_reaches_the_options():
    for system in ("neo", "directkv"):
        config = EngineArgs(model="tiny-llama", kv_policy=system, device="cpu",
                            num_host_blocks=64, **{f"{system}_host_admission": True}
                            ).create_engine_config()
        assert config.policy_options.host_admission is True
    assert EngineArgs(model="tiny-llama", kv_policy="neo", device="cpu", num_host_blocks=64
                      ).create_engine_config().policy_options.host_admission is False


@pytest.mark.parametrize("policy", ["neo", "directkv"])
@pytest.mark.parametrize("step_tokens", [96, 24], ids=["whole", "chunked"])
def test_prompts_admitted_past_the_device_keep_the_outputs(policy, step_tokens):
    """In chunks too: the room made for a prompt stays made until its last chunk (no
    request moves back into it meanwhile, and the prompt is not preempted for it)."""
    reference, _, _ = run("recompute", num_gpu_blocks=256)
    # integrity after every step, all free at the end
    outputs, engine, _ = run(policy, **{f"{policy}_host_admission": True,
                                        "max_num_batched_tokens": step_tokens})
    placement = engine.scheduler.policy
    assert placement.num_moved_for_prompts > 0
    assert engine.get_stats().num_preemptions_total == 0
    assert outputs == reference
    _, off, _ = run(policy, max_num_batched_tokens=step_tokens)
    assert off.scheduler.policy.num_moved_for_prompts == 0
