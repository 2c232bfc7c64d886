"""Builds and loads the C++ CPU decode-attention kernel (csrc/cpu_attention.cpp), once.

`-march=native` compiles for the machine that runs it (the extension is built where it runs),
so the cache key holds the CPU's feature flags beside the source, the compiler flags and the
torch and Python versions: a build directory copied to another machine, or a changed source,
never loads a stale library. The module name carries the key too, so two builds never clash
in one process. The source includes only pybind11 (tensors cross as data pointers, checked by
the Python wrapper), which keeps the build to seconds.

cpp_extension needs ninja; where there is none, the one source is compiled by one direct
compiler call into the same cache instead (an info line says so). Where the build cannot run
(no C++ compiler, a failing compile), one warning says why and callers get None: they fall
back to the pure-torch reference.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger("kvtier")

SOURCE = Path(__file__).parent / "csrc" / "cpu_attention.cpp"
HEADERS = tuple(Path(__file__).parent / "csrc" / h
                for h in ("cpu_simd.h", "cpu_amx.h", "cpu_worker.h", "cpu_layer_call.h",
                          "cpu_step_call.h"))  # included by SOURCE
# KVTIER_CPU_ATTENTION_CFLAGS appends flags (e.g. a tuning -D) for experiments; the key follows.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17",
          *os.environ.get("KVTIER_CPU_ATTENTION_CFLAGS", "").split())
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
    parts = (SOURCE.read_bytes(), *(h.read_bytes() for h in HEADERS), " ".join(cflags).encode(),
             torch.__version__.encode(), sys.version.encode(), _cpu_flags().encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _build_root() -> Path:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "torch_extensions"


def missing_compiler() -> str | None:
    """Why the build cannot start (the compiler torch would call is missing), or None."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} not found)"
    return None


def _compile_directly(name: str, build_dir: Path, cflags: tuple[str, ...]) -> ModuleType:
    """The module built by one compiler call (no ninja), or loaded if built before."""
    from torch.utils import cpp_extension

    library = build_dir / f"{name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if not library.exists():
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
        cmd = [os.environ.get("CXX", "c++"), *cflags, "-shared", "-fPIC",
               f"-DTORCH_EXTENSION_NAME={name}", *(f"-I{p}" for p in includes),
               str(SOURCE), "-o", str(partial), *LDFLAGS]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip() or f"{cmd[0]} exited {done.returncode}")
        os.replace(partial, library)  # atomic: a concurrent build never loads half a file
    spec = importlib.util.spec_from_file_location(name, library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_extension(cflags: tuple[str, ...] = CFLAGS) -> ModuleType | None:
    """The compiled module (built now or loaded from the cache), or None after one warning."""
    from torch.utils import cpp_extension

    reason = missing_compiler()
    if reason is None:
        ninja = cpp_extension.is_ninja_available()
        key = build_key(cflags if ninja else (*cflags, "direct"))
        name = f"kvtier_cpu_attention_{key}"
        build_dir = _build_root() / name
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
            if not ninja:
                log.info("CPU decode attention: ninja not found, compiling with one c++ call")
                return _compile_directly(name, build_dir, cflags)
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
