"""The host tier in the simulator: the real index and admission under the simulated
executor, its loads and stores priced by the cost model (kernel curve of the H200), their
copy seconds and stalls in the metrics at those prices, and loading a prefix back costs
less than computing it again (a long document)."""

from __future__ import annotations

import pytest

from kvtier.costmodel.hardware import CopyMechanism, get_hardware
from kvtier.engine.args import EngineArgs
from kvtier.offload.args import HostTierArgs
from kvtier.offload.items import copy_seconds
from kvtier.sampling_params import SamplingParams
from kvtier.sim import build_sim_engine

GREEDY = dict(temperature=0.0, ignore_eos=True, detokenize=False, max_tokens=4)


def _run(host_tier: HostTierArgs, **engine: int):
    args = EngineArgs(model="llama-3.1-8b", load_format="dummy", max_model_len=9000,
                      num_gpu_blocks=8 * 700, host_tier=host_tier, **engine)  # 8 groups: 11,200 tokens
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


@pytest.mark.parametrize("io_backend,load_kind,backup_kind", [
    ("kernel", "host_load", "host_backup"), ("direct", "host_load_direct", "host_backup_direct")])
def test_host_hits_are_loaded_priced_and_faster_than_recomputing(io_backend, load_kind,
                                                                 backup_kind):
    off, ttft_off = _run(HostTierArgs())
    on, ttft_on = _run(HostTierArgs(kv_offloading_size=16.0, hicache_io_backend=io_backend))
    m = on.get_stats().host_tier
    # The repeats hit all 8,000 document tokens: their heads still on the device (the
    # device evicts leaves first), their tails loaded from the host
    assert m is not None and m.gpu_hit_tokens + m.host_hit_tokens == 2 * 8000
    assert m.host_hit_tokens > 8000 and off.get_stats().host_tier is None
    kinds = {k for s in on.executor.steps for k, _ in s.shape.items}
    assert kinds == {load_kind, backup_kind}  # write-through: copies of cached blocks
    assert all(ttft_on[r] < 0.5 * ttft_off[r] for r in ("2", "3"))  # the repeats
    # First sight: nothing to load; the write-through backups of its earlier chunks run
    # beside its later ones, which pay their priced cost beside the forward (~1 %)
    assert ttft_off["0"] < ttft_on["0"] < 1.02 * ttft_off["0"]


def _priced(engine, kinds: set[str], to_device: bool, direct: bool) -> float:
    """Seconds of the recorded steps' items of `kinds` at the cost model's curve."""
    cm = engine.executor.cost_model
    return sum(copy_seconds(cm, n, to_device, direct)
               for s in engine.executor.steps for k, n in s.shape.items if k in kinds)


@pytest.mark.parametrize("io_backend", ["kernel", "direct"])
def test_simulated_copies_are_timed_at_the_profiles_curves(io_backend):
    """The simulator fills the copy-time record the runner fills from CUDA events: store
    and load seconds at the io-backend's H200 curve (so the rate achieved is the curve's
    at the step's page count), and the loads the step waits for as its stall."""
    direct = io_backend == "direct"
    e, _ = _run(HostTierArgs(kv_offloading_size=16.0, hicache_io_backend=io_backend))
    m = e.get_stats().host_tier
    assert m is not None and m.loaded_bytes > 0 and m.stored_bytes > 0
    loads = {"host_load_direct" if direct else "host_load"}
    assert m.load_seconds == pytest.approx(_priced(e, loads, True, direct))
    backups = {"host_backup_direct" if direct else "host_backup"}
    assert m.store_seconds == pytest.approx(_priced(e, backups, False, direct))
    assert m.load_stall_seconds == pytest.approx(m.load_seconds)  # nothing prefetched
    page, hw = e.executor.cost_model.config.block_bytes, get_hardware("h200")
    # A page's time: the batch call pays its per-piece cost for each page, the kernel its
    # launch once a step (under 1 % of a step's hundreds of pages)
    for curves, rate in ((hw.h2d, m.load_gb_per_s), (hw.d2h, m.store_gb_per_s)):
        if direct:
            per_page = curves[CopyMechanism.MEMCPY_BATCH].seconds(page)
        else:
            per_page = curves[CopyMechanism.KERNEL_GATHER].alpha_s_per_byte * page
        assert rate == pytest.approx(page / per_page / 1e9, rel=0.01)

@pytest.mark.parametrize("io_backend", ["kernel", "direct"])
def test_simulated_prefetches_take_copy_time_but_no_stall(io_backend):
    """Bubble filling: a host hit loaded while another request runs (one seat: the repeat
    waits for it) crosses PCIe (copy seconds) in the step's background (no stall); the
    loads the forward waits for do. Each io-backend's copies come as its own kinds, priced
    at its own curve."""
    direct = io_backend == "direct"
    suffix = "_direct" if direct else ""
    e, _ = _run(HostTierArgs(kv_offloading_size=16.0, hicache_io_backend=io_backend,
                             hicache_prefetch=True), max_num_seqs=1)
    before = e.get_stats().host_tier
    assert before is not None and before.prefetched_tokens == 0
    e.add_request("new", list(range(50_000, 54_000)), SamplingParams(**GREEDY))
    e.add_request("repeat", [*range(8000), 9, 9], SamplingParams(**GREEDY))  # doc[0] again
    while e.has_unfinished_requests():
        e.step()
    m = e.get_stats().host_tier
    assert m is not None and m.prefetched_tokens > 0
    prefetch = _priced(e, {"host_prefetch" + suffix}, True, direct)
    assert prefetch > 0
    loads = _priced(e, {"host_load" + suffix}, True, direct)
    assert m.load_seconds == pytest.approx(loads + prefetch)
    assert m.load_stall_seconds == pytest.approx(m.load_seconds - prefetch)
    other = "host_prefetch" if direct else "host_prefetch_direct"
    assert not any(k == other for s in e.executor.steps for k, _ in s.shape.items)
