"""What a first `kvtier --help` / `kvtier profile` on a CPU shows."""

from __future__ import annotations

import pytest
import torch

from kvtier.cli import build_parser


def _help(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command].format_help()


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_num_gpu_blocks_override_is_in_help(command):
    assert "--num-gpu-blocks-override" in _help(command)  # as the README says


def test_profile_on_a_cpu_lists_the_hardware_names(monkeypatch):
    from kvtier.costmodel.hardware import hardware_names
    from kvtier.profiler.calibrate import detect_hardware

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        detect_hardware()
    assert "--hardware" in str(e.value)
    assert all(name in str(e.value) for name in hardware_names())
