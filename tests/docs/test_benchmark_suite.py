"""The benchmark suite runs as documented: every script imports and shows `--help` on the CPU
(`python -m benchmarks.<subject>.<script>`), the index lists every script, every documented
command names a module that exists, and every device part the pages name exists."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
PAGES = ["README.md", "docs/RESULTS.md", "benchmarks/README.md", "docs/ARCHITECTURE.md",
         "results/fidelity/fidelity_h200.md"]
MODULE_CMD = re.compile(r"python3?\s+-m\s+(benchmarks(?:\.\w+)+)")
PATH_CMD = re.compile(r"python3?\s+benchmarks/\S+\.py")
DEVICE_PART = re.compile(r"device_runs\.sh\s+((?:[a-z0-9]+-?)+)")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def scripts() -> list[str]:
    """Benchmark modules that run as a script (the rest are their libraries)."""
    return sorted(module_name(p) for p in BENCH.rglob("*.py")
                  if p.name != "__init__.py" and '__name__ == "__main__"' in p.read_text())


def libraries() -> list[str]:
    return sorted(module_name(p) for p in BENCH.rglob("*.py")
                  if p.name != "__init__.py" and module_name(p) not in scripts())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # runpy: module imported by a sibling
@pytest.mark.parametrize("module", scripts())
def test_script_shows_help(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        runpy.run_module(module, run_name="__main__")
    assert done.value.code == 0
    assert "usage:" in out.getvalue()


@pytest.mark.parametrize("module", libraries())
def test_library_module_imports(module: str) -> None:
    __import__(module)


def test_suite_has_its_subjects() -> None:
    mods = scripts()
    assert len(mods) >= 30
    subjects = {m.split(".")[1] for m in mods if m.count(".") == 2}
    assert {"kernels", "gpu_path", "offline", "policies", "sim", "fidelity", "planner",
            "experiments"} <= subjects
    assert not [p.name for p in BENCH.glob("*.py")
                if p.name not in {"__init__.py", "common.py", "prepare_workload.py"}], \
        "scripts live in a subject's folder"


def test_index_lists_every_script() -> None:
    index = (BENCH / "README.md").read_text()
    listed = set(re.findall(r"`(?:[\w]+/)*(\w+)\.py`", index))
    missing = [m for m in scripts() + libraries() if m.rsplit(".", 1)[-1] not in listed]
    assert not missing, f"benchmarks/README.md does not list {missing}"


def documented_text() -> dict[str, str]:
    pages = {p: (ROOT / p).read_text() for p in PAGES}
    pages.update({str(p.relative_to(ROOT)): p.read_text()
                  for p in list(BENCH.rglob("*.py")) + list(BENCH.rglob("*.sh"))})
    pages.update({str(p.relative_to(ROOT)): p.read_text()
                  for p in (ROOT / "kvtier").rglob("*.py")})
    return pages


def test_documented_commands_name_existing_modules() -> None:
    known = set(scripts())
    bad = [f"{page}: {m}" for page, text in documented_text().items()
           for m in MODULE_CMD.findall(text) if m not in known]
    assert not bad, bad


def test_commands_are_documented_one_way() -> None:
    """Scripts run as modules from the repository root; a path-style command would miss
    the `benchmarks` package on sys.path."""
    bad = [f"{page}: {m}" for page, text in documented_text().items()
           for m in PATH_CMD.findall(text)]
    assert not bad, bad


def device_parts() -> set[str]:
    out = subprocess.run(["bash", str(BENCH / "device_runs.sh"), "list"], capture_output=True,
                         text=True, check=True).stdout
    return {line.split("\t")[0] for line in out.splitlines()}


def test_device_parts_named_in_pages_exist() -> None:
    parts = device_parts()
    assert {"gpu-tests", "offline", "decode-targets", "fidelity-trace"} <= parts
    named = {p for text in documented_text().values() for p in DEVICE_PART.findall(text)}
    assert named - {"list"} <= parts, sorted(named - parts - {"list"})
    index = (BENCH / "README.md").read_text()
    assert not [p for p in parts if f"`{p}`" not in index], "the index lists every part"


def test_unknown_device_part_is_refused(tmp_path: Path) -> None:
    run = subprocess.run(["bash", str(BENCH / "device_runs.sh"), "offline", "no-such-part"],
                         capture_output=True, text=True, env={"OUT": str(tmp_path),
                                                              "PATH": "/usr/bin:/bin"})
    assert run.returncode == 2 and "unknown part: no-such-part" in run.stderr
    assert not any(tmp_path.iterdir()), "nothing ran before the names were checked"


FAKE_PYTHON = """#!/bin/sh
# Records the module each part runs and writes the file its --out names, as a real run would.
echo "$@" >> "$OUT/calls.txt"
while [ $# -gt 0 ]; do
  if [ "$1" = --out ]; then mkdir -p "$(dirname "$2")"; echo '{}' > "$2"; fi
  shift
done
"""


def test_device_parts_run_documented_modules_into_their_subject(tmp_path: Path) -> None:
    """With a stand-in python3, each part calls modules that exist and writes its files
    under $OUT/<subject>/, the results/ folder they are committed to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    parts = ["offline", "swap-overlap", "calibrate-13b", "fidelity-trace", "decode-targets",
             "kernels-short-context", "policies-13b-ridge"]
    run = subprocess.run(["bash", str(BENCH / "device_runs.sh"), *parts], cwd=ROOT,
                         capture_output=True, text=True,
                         env={"OUT": str(out), "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"offline/offline_sharegpt_h200.json", "policies/swap_overlap_h200.json",
            "calibration/calib_h200_llama-2-13b.json", "fidelity/fidelity_real_h200.json",
            "gpu_path/gpu_path_h200_targets.json", "kernels/kernels_short_context_h200.json",
            "serving/bench_13b_ellm_ridge_h200.tar.gz"} <= written
    modules = {line.split()[1] for line in (out / "calls.txt").read_text().splitlines()
               if line.startswith("-m ")}
    missing = [m for m in modules if m not in scripts() and importlib.util.find_spec(m) is None]
    assert modules and not missing, missing


def test_result_records_the_module_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """A result JSON's command is one a reader can paste at the repository root."""
    from types import ModuleType, SimpleNamespace

    from benchmarks.common import command_line

    main = ModuleType("__main__")
    main.__spec__ = SimpleNamespace(name="benchmarks.offline.bench_offline_throughput")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["/abs/bench_offline_throughput.py", "--out", "x.json"])
    assert command_line() == "python -m benchmarks.offline.bench_offline_throughput --out x.json"
    main.__spec__ = None  # run as a file
    assert command_line() == "bench_offline_throughput.py --out x.json"
