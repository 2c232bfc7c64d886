"""Compiling every decode-kernel variant a run can ask for before anything is timed: the
eager decode path picks its split count per step, and a first use compiles (seconds)."""

from __future__ import annotations

import torch


def warm_decode_splits(runner, max_num_seqs: int, max_model_len: int) -> int:
    """Launch the decode kernel once with every split count `default_num_splits` can return
    for up to `max_num_seqs` rows and `max_model_len` tokens; returns how many."""
    if runner.device.type != "cuda":
        return 0
    from kvtier.kernels import paged_decode_launch as launch
    from kvtier.kernels.launch import num_sms
    from kvtier.kernels.paged_decode_attention import paged_decode_attention

    mc = runner.model_config
    elem = torch.empty((), dtype=runner.dtype).element_size()
    per_sm = launch.programs_per_sm(launch._default_block_n(mc.head_dim, runner.dtype),
                                    mc.head_dim, elem, 3)
    sms = num_sms(runner.device)
    splits = {launch.default_num_splits(b, mc.num_kv_heads, s, sms, per_sm)
              for b in range(1, max_num_seqs + 1) for s in range(16, max_model_len + 16, 16)}
    q = torch.randn(1, mc.num_heads, mc.head_dim, dtype=runner.dtype, device=runner.device)
    tables = torch.zeros(1, 64, dtype=torch.int32, device=runner.device)
    lens = torch.full((1,), 16 * 64, dtype=torch.int32, device=runner.device)
    for n in sorted(splits):
        paged_decode_attention(q, runner.gpu_kv[:, 0], tables, lens, 1.0, num_splits=n,
                               max_seq_len=16 * 64)
    torch.cuda.synchronize()
    return len(splits)
