"""When the decode kernels launch with programmatic dependent launch (kvtier/kernels/pdl.py),
and that a chain of them inside a CUDA graph reads what the kernel before wrote."""

import pytest
import torch

from kvtier.kernels.pdl import pdl_launch
from kvtier.kernels.rms_norm import fused_add_rms_norm
from kvtier.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref


def test_off_on_the_cpu_and_under_the_interpreter():
    assert pdl_launch(torch.device("cpu")) == {"USE_PDL": False}


def test_off_with_the_switch(monkeypatch):
    monkeypatch.setenv("KVTIER_PDL", "0")
    assert pdl_launch(torch.device("cuda", 0)) == {"USE_PDL": False}


@pytest.mark.gpu
def test_on_for_hopper_and_a_graph_chain_sees_each_write():
    dev = torch.device("cuda")
    on = torch.cuda.get_device_capability()[0] >= 9
    assert pdl_launch(dev) == ({"USE_PDL": True, "launch_pdl": True} if on else
                               {"USE_PDL": False})
    # Each kernel consumes the previous one's output at once: a read before the wait would
    # see the poison (NaN) or a stale value.
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(8, 256, device=dev, generator=g)
    res = torch.randn(8, 256, device=dev, generator=g)
    w = torch.rand(256, device=dev, generator=g) + 0.5
    out = torch.full((8, 128), float("nan"), device=dev)

    def chain() -> None:
        h = x
        r = res
        for _ in range(20):
            h, r = fused_add_rms_norm(h, r, w, 1e-6)
        out.copy_(silu_and_mul(h))

    chain()
    expect = out.clone()
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect)
    # and the chain is the reference's
    h, r = x, res
    for _ in range(20):
        s = (h + r)
        h, r = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w, s
    torch.testing.assert_close(expect, silu_and_mul_ref(h), rtol=1e-4, atol=1e-4)
