"""Where a result was measured: code version, software versions, CPU and GPU."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info() -> dict:
    """The checkout's commit, unless KVTIER_GIT_COMMIT names it: a copy of the working tree
    on another machine (the GPU runs) may carry a stale .git."""
    given = os.environ.get("KVTIER_GIT_COMMIT")
    if given:
        return {"commit": given, "dirty": None, "source": "KVTIER_GIT_COMMIT"}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def software_and_gpu() -> dict:
    info: dict = {"python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    except ImportError:
        info["torch"] = None
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info.setdefault("gpu", None)
    return info


def environment() -> dict:
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git": git_info(),
        "hostname": platform.node(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        **software_and_gpu(),
    }
