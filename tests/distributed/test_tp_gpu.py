"""On GPUs (NCCL, fp32): TP=2's greedy tokens equal TP=1's, with CUDA graphs (full decode
graphs and pieces capture the collectives) and eagerly, for recompute and swap under
preemption. Skipped without two GPUs."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.test_tp_engine import _engine, _prompts, _serve

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600),
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]


@pytest.mark.parametrize("policy", ["recompute", "swap", "ellm", "hcache"])
@pytest.mark.parametrize("eager", [False, True])
def test_tp2_equals_tp1_on_gpus(policy, eager):
    kw = dict(device="cuda", kv_policy=policy, enforce_eager=eager, model="tiny-llama-gqa")
    prompts = _prompts(12)
    one, _ = _serve(_engine(1, **kw), prompts)
    two, preemptions = _serve(_engine(2, **kw), prompts)
    assert two == one
    assert preemptions > 0
