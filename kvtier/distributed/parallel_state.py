"""The tensor-parallel process group: one process per rank, gloo on the CPU, NCCL on GPUs.

Only tensors travel over it (all-reduce, all-gather, broadcast of sampled tokens): each
step's plan reaches the workers over a pipe (kvtier/distributed/executor.py), so the
collectives here are the forward's own.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

# A collective that waits longer than this raises instead of hanging (a rank that died
# mid-step on a backend that does not notice closed connections).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


def free_port() -> int:
    """A TCP port free on this host now, for the group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TPGroup:
    """This process's rank in the group and the collectives the sharded model calls."""

    def __init__(self, rank: int, size: int, port: int, device: torch.device,
                 timeout: timedelta = COLLECTIVE_TIMEOUT):
        self.rank, self.size, self.device = rank, size, device
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(self.backend, init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=size, timeout=timeout)
        self.group = dist.group.WORLD

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (the row-parallel projections' partial sums)."""
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """[n, c] per rank -> [size, n, c], rank r's block at index r."""
        out = torch.empty((self.size, *x.shape), dtype=x.dtype, device=x.device)
        if self.backend == "nccl":
            dist.all_gather_into_tensor(out, x.contiguous(), group=self.group)
        else:  # gloo has no all_gather_into_tensor
            dist.all_gather(list(out.unbind(0)), x.contiguous(), group=self.group)
        return out

    def broadcast_from_driver(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` into every rank's `x` (in place)."""
        dist.broadcast(x, src=0, group=self.group)
        return x

    def min_ints(self, values: list[int]) -> list[int]:
        """Each value's minimum over ranks (pool sizes every rank can hold)."""
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return [int(v) for v in t.tolist()]

    def abort(self) -> None:
        """Make this process's pending and later collectives fail now (a rank died). Gloo
        notices a closed connection by itself; NCCL would wait for the timeout."""
        if self.backend == "nccl" and dist.is_initialized():
            dist.distributed_c10d._abort_process_group()

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
