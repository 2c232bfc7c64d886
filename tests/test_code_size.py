"""Small files and short functions in kvtier/: no function over 60 lines, no file over 400
(a kernel's file may reach 500: the Triton kernel, its wrapper and its reference sit
together)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvtier"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
MAX_KERNEL_FILE_LINES = 500


def file_limit(path: Path) -> int:
    kernels = PACKAGE / "kernels"
    return MAX_KERNEL_FILE_LINES if kernels in path.parents else MAX_FILE_LINES


def long_files(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > file_limit(path):
            out.append(f"{path.relative_to(package.parent)}: {lines} lines")
    return out


def long_functions(package: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (methods and nested ones too) longer than `limit` lines, counted from
    its `def` (or first decorator) to its last line."""
    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = node.end_lineno - first + 1
                if lines > limit:
                    out.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name}: {lines}")
    return out


def test_no_file_over_its_limit():
    assert not long_files(PACKAGE), "files over the limit:\n" + "\n".join(long_files(PACKAGE))


def test_no_function_over_60_lines():
    found = long_functions(PACKAGE)
    assert not found, "functions over 60 lines:\n" + "\n".join(found)


def test_the_counts_see_a_long_function_and_file(tmp_path):
    """The walkers above find what they look for, so the tests can fail."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"@staticmethod\ndef long():\n{body}\n\n"
                                      "def short():\n    return 1\n" + "\n" * 400)
    assert [f.split(" ", 1)[1] for f in long_functions(tmp_path)] == [
        f"long: {MAX_FUNCTION_LINES + 2}"]
    assert len(long_files(tmp_path)) == 1
