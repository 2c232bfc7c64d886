"""The host tier in the simulator: the real index and admission under the simulated
executor, its loads and stores priced by the cost model (kernel curve of the H200), and
loading a prefix back costs less than computing it again (a long document)."""

from __future__ import annotations

import pytest

from kvtier.engine.args import EngineArgs
from kvtier.offload.args import HostTierArgs
from kvtier.sampling_params import SamplingParams
from kvtier.sim import build_sim_engine

GREEDY = dict(temperature=0.0, ignore_eos=True, detokenize=False, max_tokens=4)


def _run(host_tier: HostTierArgs):
    args = EngineArgs(model="llama-3.1-8b", load_format="dummy", max_model_len=9000,
                      num_gpu_blocks=8 * 700, host_tier=host_tier)  # 8 groups: 11,200 tokens
    e = build_sim_engine(args, "h200", record_steps=True)
    doc = [list(range(1000 * k, 1000 * k + 8000)) for k in range(2)]
    ttft = {}
    for i, prompt in enumerate([doc[0], doc[1], doc[0], doc[1]]):
        t0 = e.clock()
        e.add_request(str(i), [*prompt, 7, i], SamplingParams(**GREEDY))
        while e.has_unfinished_requests():
            for out in e.step():
                if out.outputs[0].token_ids and str(i) not in ttft:
                    ttft[str(i)] = e.clock() - t0
    return e, ttft


@pytest.mark.parametrize("io_backend,load_kind", [("kernel", "host_load"),
                                                   ("direct", "host_load_direct")])
def test_host_hits_are_loaded_priced_and_faster_than_recomputing(io_backend, load_kind):
    off, ttft_off = _run(HostTierArgs())
    on, ttft_on = _run(HostTierArgs(kv_offloading_size=16.0, hicache_io_backend=io_backend))
    m = on.get_stats().host_tier
    # The repeats hit all 8,000 document tokens: their heads still on the device (the
    # device evicts leaves first), their tails loaded from the host
    assert m is not None and m.gpu_hit_tokens + m.host_hit_tokens == 2 * 8000
    assert m.host_hit_tokens > 8000 and off.get_stats().host_tier is None
    kinds = {k for s in on.executor.steps for k, _ in s.shape.items}
    assert kinds == {load_kind, "host_backup"}  # write-through: copies of cached blocks
    assert all(ttft_on[r] < 0.5 * ttft_off[r] for r in ("2", "3"))  # the repeats
    assert ttft_on["0"] == ttft_off["0"]  # first sight: nothing to load, stores come later
