"""Comments say why; numbers live in results (issue 29, item 8).

No comment or docstring in kvtier/ quotes a measured time, bandwidth or rate, a run's date or
a session/issue number: where a design choice rests on a measurement, the comment cites the
result file (`results/<subject>/<file>.json`, which must exist) that holds the figure.
Percentages are not checked (most in kvtier/ are rules or arithmetic: vLLM's 4 % chunk cap, a
padding bound).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KVTIER = ROOT / "kvtier"

_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
_UNIT = (r"(?:ms|us|µs|ns|s|GB/s|TB/s|GiB/s|MB/s|MiB/s|TFLOP/s|TFLOPS|GFLOP/s|tok/s|"
         r"tokens/s|req/s|MHz|GHz)")
FIGURE = re.compile(
    rf"(?<![\w.]){_NUMBER}(?:\s?(?:-|–|->|to)\s?{_NUMBER})?\s?{_UNIT}(?![\w/])"
    r"|\b(?:session|issue)s? #?\d+"
    r"|(?<![\w/.-])20\d\d-\d\d-\d\d(?![\w.])"
)

def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a source file."""
    src = path.read_text()
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(
        io.StringIO(src).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def figures(path: Path) -> list[str]:
    """'file:line: match' for each measured figure quoted in a comment or docstring."""
    rel = path.relative_to(ROOT).as_posix()
    hits = []
    for line, text in _texts(path):
        for m in FIGURE.finditer(" ".join(text.split())):
            hits.append(f"{rel}:{line}: {m.group(0)!r}")
    return hits


@pytest.mark.parametrize("text", [
    "the step took 21.82 ms instead of 22.02", "~80 µs a GEMM", "7.97 us per page",
    "took 0.78 s instead of", "37.5 GB/s at 320 KiB", "~3.8 TB/s", "329 TFLOP/s on",
    "3.4-3.6 -> 2.6-2.7 us", "2-15 us", "1,000 tok/s", "(issue 7)", "session 15 showed",
    "fidelity traces of 2026-11-30,", "12.5 req/s",
])
def test_figure_pattern_catches_measurements(text):
    assert FIGURE.search(text), text


@pytest.mark.parametrize("text", [
    "vLLM's rule, 4 % of max_model_len", "positions 0..s-1", "a 16 x 128 tile",
    "(shared/hw/h200_probe_2026-11-30.json)", "results/kernels/launch_overhead_h200.json",
    "tpot_slo_s", "the interval [0, s)", "issue times of whole piecewise forwards",
    "256 seats, 8,192 tokens",
    "4 KiB for 16 x 128 bf16", "up to 1024 seats",
])
def test_figure_pattern_spares_rules_and_citations(text):
    assert not FIGURE.search(text), text


def test_no_measured_figures_in_kvtier_comments():
    hits = []
    for path in sorted(KVTIER.rglob("*.py")):
        hits += figures(path)
    assert not hits, ("comments/docstrings quote measured figures; cite the result file "
                      "instead:\n" + "\n".join(hits))


CITATION = re.compile(r"results/[\w./-]+\.(?:json|md|png|txt|csv)")


def test_cited_result_files_exist():
    missing = []
    for path in sorted(KVTIER.rglob("*.py")):
        for line, text in _texts(path):
            missing += [f"{path.relative_to(ROOT).as_posix()}:{line}: {m}"
                        for m in CITATION.findall(text) if not (ROOT / m).is_file()]
    assert not missing, "cited result files that do not exist:\n" + "\n".join(missing)
