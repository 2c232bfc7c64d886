"""The host tier on the GPU (fp32, tiny Llama): pinned pages, the copy stream with one event
per layer group, both io-backends, async scheduling and CUDA graphs as the engine runs by
default; greedy outputs identical to caching off, and the copies' timing events read."""

from __future__ import annotations

import pytest

from kvtier.offload.args import HostTierArgs
from kvtier.offload.install import enable_host_tier
from tests.policies.test_strata_engine import PARAMS, _engine, _prompts, _serve


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["kernel", "direct"])
def test_greedy_outputs_equal_caching_off_on_the_gpu(backend):
    reference = _serve(_engine(cache=False, device="cuda"), _prompts(), PARAMS)
    eng = _engine(cache=True, device="cuda")
    tier = enable_host_tier(eng, HostTierArgs(kv_offloading_size=0.01, hicache_io_backend=backend,
                                              hicache_min_load_blocks=1))  # tiny prompts
    assert _serve(eng, _prompts(), PARAMS) == reference
    assert tier.stats.hit_blocks > 0
    copies = eng.executor.copies.tier
    times = copies.timer.flush()
    assert times.load_s > 0 and times.store_s > 0 and times.stall_s >= 0
    m = eng.get_stats().host_tier
    assert m.load_gb_per_s > 0 and m.loaded_bytes == copies.counters.loaded_pages * eng.block_bytes
