"""Host page I/O: the Triton gather/scatter equal their torch references bit for bit (the
interpreter on the CPU, compiled on a GPU), the copy-engine backend equals them too, and bad
input is refused before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from kvtier.kernels import host_page_io as hp
from kvtier.kernels.cuda_memcpy import pieces
from kvtier.kernels.host_page_backends import (
    DirectVia,
    HostPageIO,
    IOBackend,
    PageIOConfig,
    copy_pages_direct,
    runs,
)
from kvtier.kernels.host_page_io import (
    HostPageLayout,
    block_order,
    gather_to_host,
    gather_to_host_ref,
    host_page_shape,
    scatter_to_gpu,
    scatter_to_gpu_ref,
)
from tests.kernels.kernel_testing import DEVICE, gpu

LAYOUTS = list(HostPageLayout)
DTYPES = [torch.float32, torch.bfloat16]


def sync() -> None:
    """Before the host reads pages a kernel or copy wrote (those writes are asynchronous)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def pools(num_blocks: int, num_pages: int, layout: HostPageLayout, dtype: torch.dtype,
          f: int = 2, bs: int = 4, h: int = 2, d: int = 8, device: torch.device = DEVICE):
    """Random device pool [nb, F, 2, bs, H, D] and host pool of pages in `layout` (pinned
    beside a CUDA pool)."""
    gen = torch.Generator(device).manual_seed(num_blocks * 31 + num_pages)
    gpu_kv = torch.randn(num_blocks, f, 2, bs, h, d, generator=gen, device=device).to(dtype)
    page = host_page_shape((f, 2, bs, h, d), layout)
    host_kv = torch.zeros(num_pages, *page, dtype=dtype, pin_memory=device.type == "cuda")
    host_kv.copy_(torch.randn(host_kv.shape, generator=gen, device=device))
    return gpu_kv, host_kv


def id_lists(n: int, num_src: int, num_dst: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n pairs: a run of consecutive ids on both sides (1.. -> 2..), then shuffled ones;
    sources may repeat, targets are distinct."""
    gen = torch.Generator().manual_seed(seed)
    run = min(3, n)
    src = torch.cat([torch.arange(1, 1 + run),
                     torch.randint(0, num_src, (n - run,), generator=gen)])
    others = [i for i in torch.randperm(num_dst, generator=gen).tolist() if not 2 <= i < 2 + run]
    dst = torch.tensor(list(range(2, 2 + run)) + others[: n - run])
    assert len(dst) == n and len(set(dst.tolist())) == n
    return src, dst


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_programs,tile_bytes", [(1, 64), (3, 256), (8, 1 << 16)])
def test_gather_matches_reference(layout, dtype, num_programs, tile_bytes):
    gpu_kv, host_kv = pools(9, 7, layout, dtype)
    src, dst = id_lists(5, 9, 7, seed=num_programs)
    before, expected = host_kv.clone(), host_kv.clone()
    gather_to_host_ref(gpu_kv, expected, src, dst, layout)
    gather_to_host(gpu_kv, host_kv, src.to(DEVICE), dst.to(DEVICE), layout,
                   num_programs=num_programs, tile_bytes=tile_bytes)
    sync()
    assert torch.equal(host_kv, expected)
    # the reference itself: the listed pages hold the blocks, the others are untouched
    untouched = [p for p in range(7) if p not in dst.tolist()]
    assert torch.equal(block_order(expected, layout)[dst], gpu_kv[src.to(DEVICE)].cpu())
    assert torch.equal(expected[untouched], before[untouched])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_programs,tile_bytes", [(1, 64), (2, 512), (16, 1 << 16)])
def test_scatter_matches_reference(layout, dtype, num_programs, tile_bytes):
    gpu_kv, host_kv = pools(8, 10, layout, dtype)
    src, dst = id_lists(6, 10, 8, seed=7 + num_programs)
    expected = gpu_kv.clone()
    scatter_to_gpu_ref(host_kv, expected, src, dst, layout)
    scatter_to_gpu(host_kv, gpu_kv, src.to(DEVICE), dst.to(DEVICE), layout,
                   num_programs=num_programs, tile_bytes=tile_bytes)
    sync()
    assert torch.equal(gpu_kv, expected)
    assert torch.equal(expected[dst.to(DEVICE)].cpu(), block_order(host_kv, layout)[src])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_paced_copies_with_fewer_warps_match_reference(layout):
    """Pacing and the warp count change when tiles are issued, never what is moved (under
    the interpreter, which has no timer, the copy runs unpaced)."""
    gpu_kv, host_kv = pools(9, 8, layout, torch.bfloat16)
    src, dst = id_lists(6, 9, 8, seed=11)
    expected = host_kv.clone()
    gather_to_host_ref(gpu_kv, expected, src, dst, layout)
    gather_to_host(gpu_kv, host_kv, src.to(DEVICE), dst.to(DEVICE), layout, num_programs=3,
                   tile_bytes=128, num_warps=4, paced_gbps=5.0)
    sync()
    assert torch.equal(host_kv, expected)
    want, blocks = gpu_kv.clone(), torch.tensor([0, 4, 7, 8, 2, 5])
    scatter_to_gpu_ref(host_kv, want, dst, blocks, layout)
    scatter_to_gpu(host_kv, gpu_kv, dst.to(DEVICE), blocks.to(DEVICE), layout, num_programs=2,
                   tile_bytes=256, paced_gbps=5.0)
    sync()
    assert torch.equal(gpu_kv, want)


def test_pacing_rate_and_warps_are_checked():
    gpu_kv, host_kv = pools(3, 3, HostPageLayout.HEAD_MAJOR, torch.float32)
    ids = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="paced_gbps must be > 0"):
        gather_to_host(gpu_kv, host_kv, ids, ids, paced_gbps=0.0)
    with pytest.raises(ValueError, match="num_warps must be a power of 2"):
        scatter_to_gpu(host_kv, gpu_kv, ids, ids, num_warps=3)


@gpu
def test_gpu_paced_copy_runs_no_faster_than_its_rate():
    """64 MiB paced at 8 GB/s cannot take less than 8.4 ms (unpaced it takes ~1.3)."""
    gpu_kv, host_kv = pools(256, 256, HostPageLayout.HEAD_MAJOR, torch.bfloat16, f=4, bs=16,
                            h=8, d=128)
    ids = torch.arange(256, device=DEVICE)
    nbytes = gpu_kv.numel() * gpu_kv.element_size()
    expected = host_kv.clone()
    gather_to_host_ref(gpu_kv, expected, ids, ids)
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        gather_to_host(gpu_kv, host_kv, ids, ids, num_programs=4, paced_gbps=8.0)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    assert min(times) >= 0.99 * nbytes / 8e9, times
    assert torch.equal(host_kv, expected)


def test_head_major_page_holds_per_head_tiles():
    """HEAD_MAJOR: page[f, kv, h] is block[f, kv, :, h], a contiguous [block_size, D] tile."""
    gpu_kv, host_kv = pools(3, 2, HostPageLayout.HEAD_MAJOR, torch.float32, h=3, d=4)
    gather_to_host(gpu_kv, host_kv, torch.tensor([2], device=DEVICE),
                   torch.tensor([1], device=DEVICE))
    sync()
    for f in range(2):
        for kv in range(2):
            for h in range(3):
                tile = host_kv[1, f, kv, h]
                assert tile.is_contiguous()
                assert torch.equal(tile, gpu_kv[2, f, kv, :, h].cpu())


def test_odd_head_dim_and_int32_ids():
    """A head_dim that is not a power of two (masked lanes) and int32 ids."""
    gpu_kv, host_kv = pools(4, 4, HostPageLayout.HEAD_MAJOR, torch.float32, d=6, bs=3)
    expected = host_kv.clone()
    src, dst = torch.tensor([3, 0, 1]), torch.tensor([0, 3, 2])
    gather_to_host_ref(gpu_kv, expected, src, dst)
    gather_to_host(gpu_kv, host_kv, src.to(DEVICE, torch.int32), dst.to(DEVICE, torch.int32),
                   num_programs=2, tile_bytes=48)
    sync()
    assert torch.equal(host_kv, expected)


def test_runs_groups_consecutive_pairs():
    assert runs([4, 5, 6, 9, 1, 2], [0, 1, 2, 3, 8, 9]) == [(4, 0, 3), (9, 3, 1), (1, 8, 2)]
    assert runs([3, 4], [5, 7]) == [(3, 5, 1), (4, 7, 1)]
    assert runs([], []) == []


def test_pieces_point_at_each_run():
    assert pieces(1000, 50, 8, [(2, 0, 3), (7, 5, 1)]) == ([1016, 1056], [50, 90], [24, 8])
    assert pieces(0, 0, 8, []) == ([], [], [])


@pytest.mark.parametrize("via", list(DirectVia))
@pytest.mark.parametrize("coalesce", [True, False])
def test_direct_copies_equal_reference(coalesce, via):
    """Each way of issuing the copies (on a GPU: torch, the runtime per piece, one batch
    on a side stream) stores and loads the listed blocks exactly."""
    gpu_kv, host_kv = pools(9, 9, HostPageLayout.BLOCK, torch.float32)
    src, dst = id_lists(6, 9, 9, seed=3)
    expected = host_kv.clone()
    gather_to_host_ref(gpu_kv, expected, src, dst, HostPageLayout.BLOCK)
    side = torch.cuda.Stream() if DEVICE.type == "cuda" else None
    with torch.cuda.stream(side) if side is not None else nullcontext():
        copy_pages_direct(host_kv, gpu_kv, dst.tolist(), src.tolist(), coalesce, via)
        back = torch.zeros_like(gpu_kv)
        copy_pages_direct(back, host_kv, src.tolist(), dst.tolist(), coalesce, via)
    sync()
    assert torch.equal(host_kv, expected)
    assert torch.equal(back[src], gpu_kv[src])


@gpu
@pytest.mark.parametrize("via", list(DirectVia))
def test_direct_copies_on_the_gpu(via):
    for coalesce in (True, False):
        test_direct_copies_equal_reference(coalesce, via)


@pytest.mark.parametrize("backend,layout", [(IOBackend.KERNEL, HostPageLayout.HEAD_MAJOR),
                                            (IOBackend.KERNEL, HostPageLayout.BLOCK),
                                            (IOBackend.DIRECT, HostPageLayout.BLOCK)])
def test_backends_round_trip(backend, layout):
    """store then load through the facade: the blocks come back exactly, in new places."""
    io = HostPageIO(PageIOConfig(backend=backend, layout=layout, num_programs=2, tile_bytes=128))
    gpu_kv, host_kv = pools(8, 6, layout, torch.bfloat16)
    original = gpu_kv.clone()
    io.store(gpu_kv, host_kv, [5, 6, 7, 1], [0, 1, 2, 4])
    io.load(host_kv, gpu_kv, torch.tensor([0, 1, 2, 4]), [2, 3, 4, 0])
    sync()
    assert torch.equal(gpu_kv[[2, 3, 4, 0]], original[[5, 6, 7, 1]])
    assert torch.equal(gpu_kv[[1, 5, 6, 7]], original[[1, 5, 6, 7]])


def test_awaited_loads_take_the_load_programs(monkeypatch):
    """A load the step's layers wait for launches `load_programs` programs; stores and
    background loads launch `num_programs`."""
    launched = []
    for name in ("gather_to_host", "scatter_to_gpu"):
        monkeypatch.setattr(hp, name, lambda *a, name=name: launched.append((name, a[-2])))
    monkeypatch.setattr("kvtier.kernels.host_page_backends.interpreting", lambda: True)
    io = HostPageIO(PageIOConfig(num_programs=2, load_programs=6))
    gpu_kv, host_kv = pools(4, 4, HostPageLayout.HEAD_MAJOR, torch.float32)
    io.store(gpu_kv, host_kv, [0], [1])
    io.load(host_kv, gpu_kv, [1], [2])
    io.load(host_kv, gpu_kv, [1], [3], awaited=True)
    assert launched == [("gather_to_host", 2), ("scatter_to_gpu", 2), ("scatter_to_gpu", 6)]
    with pytest.raises(ValueError, match="load_programs"):
        PageIOConfig(load_programs=0)


def test_direct_backend_refuses_head_major():
    with pytest.raises(ValueError, match="needs host layout 'block'"):
        PageIOConfig(backend=IOBackend.DIRECT, layout=HostPageLayout.HEAD_MAJOR)
    with pytest.raises(ValueError, match="num_programs"):
        PageIOConfig(num_programs=0)


@pytest.mark.parametrize("src,dst,match", [
    ([0, 1], [0], "2 source ids vs 1 target ids"),
    ([0, 8], [0, 1], r"source ids out of range \[0, 8\): \[8\]"),
    ([0, 1], [-1, 1], r"target ids out of range \[0, 6\): \[-1\]"),
    ([0, 1], [3, 3], "target ids repeat"),
])
def test_facade_rejects_bad_ids_and_writes_nothing(src, dst, match):
    gpu_kv, host_kv = pools(8, 6, HostPageLayout.HEAD_MAJOR, torch.float32)
    before = host_kv.clone()
    with pytest.raises(ValueError, match=match):
        HostPageIO().store(gpu_kv, host_kv, src, dst)
    assert torch.equal(host_kv, before)


def test_wrapper_rejects_mismatched_pools_and_ids():
    layout = HostPageLayout.HEAD_MAJOR
    gpu_kv, host_kv = pools(4, 4, layout, torch.float32)
    ids = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="pages of"):  # block layout given for head-major pages
        gather_to_host(gpu_kv, host_kv.transpose(3, 4), ids, ids, layout)
    with pytest.raises(ValueError, match="dtypes differ"):
        gather_to_host(gpu_kv, host_kv.to(torch.bfloat16), ids, ids, layout)
    with pytest.raises(ValueError, match="gpu_kv"):
        gather_to_host(gpu_kv[:, 0], host_kv, ids, ids, layout)
    strided = torch.zeros(*host_kv.shape[:-1], 2 * host_kv.shape[-1],
                          pin_memory=DEVICE.type == "cuda")[..., ::2]
    with pytest.raises(ValueError, match="last dim must be contiguous"):
        gather_to_host(gpu_kv, strided, ids, ids, layout)
    with pytest.raises(ValueError, match="src ids: contiguous 1-D int32/int64"):
        gather_to_host(gpu_kv, host_kv, ids.float(), ids, layout)
    with pytest.raises(ValueError, match="2 src ids vs 1 dst ids"):
        scatter_to_gpu(host_kv, gpu_kv, ids, ids[:1], layout)
    with pytest.raises(ValueError, match="host_kv must be a CPU tensor"):
        gather_to_host(gpu_kv, host_kv.to("meta"), ids, ids, layout)


@gpu
def test_wrapper_rejects_unpinned_host_and_host_ids():
    layout = HostPageLayout.HEAD_MAJOR
    gpu_kv, host_kv = pools(4, 4, layout, torch.bfloat16)
    ids = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="pinned"):
        gather_to_host(gpu_kv, host_kv.clone(), ids, ids, layout)
    with pytest.raises(ValueError, match="the kernel reads them on"):
        gather_to_host(gpu_kv, host_kv, ids.cpu(), ids, layout)


@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("num_programs", [1, 2, 8, 132])
def test_gpu_llama8b_geometry(layout, block_size, num_programs):
    """Llama-3.1-8B's block (F=4, 8 KV heads, head_dim 128, bf16), hundreds of blocks, both
    directions, compiled kernels against the references."""
    gpu_kv, host_kv = pools(300, 250, layout, torch.bfloat16, f=4, bs=block_size, h=8, d=128)
    src, dst = id_lists(150, 300, 250, seed=block_size)
    expected = host_kv.clone()
    gather_to_host_ref(gpu_kv, expected, src, dst, layout)
    gather_to_host(gpu_kv, host_kv, src.cuda(), dst.cuda(), layout, num_programs=num_programs)
    torch.cuda.synchronize()
    assert torch.equal(host_kv, expected)
    back = gpu_kv.clone()
    pages, blocks = dst[:100], torch.randperm(300)[:100]
    want = gpu_kv.clone()
    scatter_to_gpu_ref(host_kv, want, pages, blocks, layout)
    scatter_to_gpu(host_kv, back, pages.cuda(), blocks.cuda(), layout, num_programs=num_programs)
    torch.cuda.synchronize()
    assert torch.equal(back, want)


def test_kernel_backend_on_cpu_without_interpreter_runs_reference(monkeypatch):
    """The CPU path: no Triton, the torch reference."""
    if DEVICE.type == "cuda":
        pytest.skip("the CPU path")
    import kvtier.kernels.host_page_backends as backends

    monkeypatch.setattr(backends, "interpreting", lambda: False)
    monkeypatch.setattr(backends.hp, "gather_to_host", None)  # a launch would fail
    gpu_kv, host_kv = pools(5, 4, HostPageLayout.HEAD_MAJOR, torch.float32)
    HostPageIO().store(gpu_kv, host_kv, [4, 0], [1, 3])
    sync()
    assert torch.equal(block_order(host_kv, HostPageLayout.HEAD_MAJOR)[[1, 3]], gpu_kv[[4, 0]])


def _ptxas_available() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return Path(get_ptxas(90).path).exists()
    except Exception:  # noqa: BLE001 - no NVIDIA backend in this Triton
        return False


@pytest.mark.skipif(not _ptxas_available(), reason="Triton's NVIDIA backend (ptxas) is absent")
def test_kernel_compiles_for_sm90_with_valid_cache_hints():
    """ptxas (Triton's own, no GPU needed) accepts the kernel for an H100/H200, and its data
    loads and stores carry the intended hints: PTX takes a cache operator or an eviction
    priority on a load, never both. A subprocess: the interpreter must be off to compile."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.sm90_compile"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for elem, asm in json.loads(proc.stdout).items():
        assert "error" not in asm, f"{elem}: {asm.get('error')}"
        data_loads = [ln for ln in asm["loads"] if ".v4." in ln]  # the 16 B row loads
        assert data_loads and all("L1::evict_first" in ln and ".cg" not in ln
                                  for ln in data_loads), data_loads
        assert asm["stores"] and all("st.global.cs." in ln for ln in asm["stores"]), asm["stores"]
        assert asm["reads_global_timer"], "the paced path's %globaltimer read is missing"
