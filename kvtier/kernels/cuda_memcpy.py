"""The CUDA runtime's asynchronous copies, called directly (ctypes) for lists of pieces.

`Tensor.copy_` goes through torch's dispatcher, checks and stream bookkeeping on every call,
which for a KV page of a few hundred KiB costs longer than the copy engine takes to move it:
the copy engine then idles between pieces (benchmarks/kernels/bench_host_page_io.py,
results/kernels/host_page_io_h200.json). The runtime's own calls cost a few microseconds
each, and `cudaMemcpyBatchAsync` (CUDA 12.8+) submits a whole list in one call, which is how
the copy engine stays busy on small pages without taking a single SM from the forward.

Pointers and sizes come from `pieces`, a pure function over block ids and strides (tested
on the CPU); the calls need a CUDA device and the runtime library torch itself loaded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Sequence

import torch

CUDA_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (UVA)
SRC_ACCESS_ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream
MEM_LOCATION_DEVICE, MEM_LOCATION_HOST = 1, 2  # cudaMemLocationType
FLAG_PREFER_OVERLAP_WITH_COMPUTE = 1  # cudaMemcpyFlagPreferOverlapWithCompute


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _MemLocation),
                ("dstLocHint", _MemLocation), ("flags", ctypes.c_uint)]


def pieces(dst_base: int, src_base: int, stride: int, runs: Sequence[tuple[int, int, int]]
           ) -> tuple[list[int], list[int], list[int]]:
    """Destination pointers, source pointers and byte sizes of one copy per (dst start,
    src start, length) run, for pools of equal per-block `stride` bytes."""
    dsts = [dst_base + d * stride for d, _, _ in runs]
    srcs = [src_base + s * stride for _, s, _ in runs]
    return dsts, srcs, [k * stride for _, _, k in runs]


@functools.cache
def _runtime() -> ctypes.CDLL | None:
    """The CUDA runtime torch loaded (same process, same library), or None."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.init()
    for name in ("libcudart.so.13", "libcudart.so.12", ctypes.util.find_library("cudart")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int, ctypes.c_void_p]
        lib.cudaMemcpyAsync.restype = ctypes.c_int
        return lib
    return None


def available() -> bool:
    return _runtime() is not None


@functools.cache
def runtime_version() -> int:
    lib = _runtime()
    v = ctypes.c_int(0)
    if lib is None or lib.cudaRuntimeGetVersion(ctypes.byref(v)) != 0:
        return 0
    return v.value


def has_batch() -> bool:
    """cudaMemcpyBatchAsync exists (CUDA 12.8+) with a signature this module knows."""
    lib = _runtime()
    return lib is not None and runtime_version() >= 12080 and hasattr(lib, "cudaMemcpyBatchAsync")


def _raise(err: int, what: str) -> None:
    if err:
        lib = _runtime()
        name = ctypes.c_char_p(lib.cudaGetErrorString(err)).value if lib else b"?"
        raise RuntimeError(f"{what} failed: CUDA error {err} ({name!r})")


def memcpy_each(dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int],
                stream: int) -> None:
    """One cudaMemcpyAsync per piece on `stream` (a raw stream handle)."""
    lib = _runtime()
    if lib is None:
        raise RuntimeError("the CUDA runtime is not available")
    copy = lib.cudaMemcpyAsync
    for d, s, n in zip(dsts, srcs, sizes):
        _raise(copy(d, s, n, CUDA_MEMCPY_DEFAULT, stream), "cudaMemcpyAsync")


def memcpy_batch(dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int],
                 stream: int, to_host: bool, device_index: int) -> None:
    """Every piece in one cudaMemcpyBatchAsync on `stream`, ordered after the stream's
    earlier work (source access order "stream"), preferring to overlap compute."""
    lib = _runtime()
    n = len(sizes)
    if lib is None or not n:
        if n:
            raise RuntimeError("the CUDA runtime is not available")
        return
    host = _MemLocation(MEM_LOCATION_HOST, 0)
    dev = _MemLocation(MEM_LOCATION_DEVICE, device_index)
    attr = _MemcpyAttributes(SRC_ACCESS_ORDER_STREAM, dev if to_host else host,
                             host if to_host else dev, FLAG_PREFER_OVERLAP_WITH_COMPUTE)
    ptrs = ctypes.c_void_p * n
    d_arr, s_arr, n_arr = ptrs(*dsts), ptrs(*srcs), (ctypes.c_size_t * n)(*sizes)
    idx = (ctypes.c_size_t * 1)(0)
    if runtime_version() >= 13000:  # CUDA 13 dropped the failIdx out-parameter
        err = lib.cudaMemcpyBatchAsync(d_arr, s_arr, n_arr, ctypes.c_size_t(n),
                                       ctypes.byref(attr), idx, ctypes.c_size_t(1),
                                       ctypes.c_void_p(stream))
    else:
        fail = ctypes.c_size_t(0)
        err = lib.cudaMemcpyBatchAsync(d_arr, s_arr, n_arr, ctypes.c_size_t(n),
                                       ctypes.byref(attr), idx, ctypes.c_size_t(1),
                                       ctypes.byref(fail), ctypes.c_void_p(stream))
    _raise(err, "cudaMemcpyBatchAsync")
