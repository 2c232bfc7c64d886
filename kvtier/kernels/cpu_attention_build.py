"""Builds and loads the C++ CPU decode-attention kernel (csrc/cpu_attention.cpp), once.

`-march=native` compiles for the machine that runs it (the extension is built where it runs),
so the cache key holds the CPU's feature flags beside the source, the compiler flags and the
torch and Python versions: a build directory copied to another machine, or a changed source,
never loads a stale library. The module name carries the key too, so two builds never clash
in one process. The source includes only pybind11 (tensors cross as data pointers, checked by
the Python wrapper), which keeps the build to seconds.

Where the build cannot run (no C++ compiler, no ninja, a failing compile), one warning says
why and callers get None: they fall back to the pure-torch reference.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger("kvtier")

SOURCE = Path(__file__).parent / "csrc" / "cpu_attention.cpp"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17")
LDFLAGS = ("-fopenmp",)


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_key(cflags: tuple[str, ...] = CFLAGS) -> str:
    parts = (SOURCE.read_bytes(), " ".join(cflags).encode(), torch.__version__.encode(),
             sys.version.encode(), _cpu_flags().encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _build_root() -> Path:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "torch_extensions"


def missing_tool() -> str | None:
    """Why the build cannot start, or None: the compiler torch would call, and ninja."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} not found)"
    if not cpp_extension.is_ninja_available():
        return "ninja not found (pip install ninja)"
    return None


def build_extension(cflags: tuple[str, ...] = CFLAGS) -> ModuleType | None:
    """The compiled module (built now or loaded from the cache), or None after one warning."""
    from torch.utils import cpp_extension

    reason = missing_tool()
    if reason is None:
        key = build_key(cflags)
        name = f"kvtier_cpu_attention_{key}"
        build_dir = _build_root() / name
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
            return cpp_extension.load(
                name=name, sources=[str(SOURCE)], extra_cflags=list(cflags),
                extra_ldflags=list(LDFLAGS), build_directory=str(build_dir), verbose=False,
            )
        except (OSError, RuntimeError, ImportError) as exc:
            reason = f"build failed ({type(exc).__name__}: {str(exc).strip().splitlines()[-1:]})"
    log.warning("CPU decode attention: %s; using the pure-torch reference (slower)", reason)
    return None


@functools.cache
def cpu_attention_extension() -> ModuleType | None:
    """The kernel for this process: built or loaded on first use, None where it cannot be."""
    return build_extension()
