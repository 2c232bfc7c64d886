"""Every result file the README and docs/RESULTS.md cite is committed: a figure is shown only
with the file it came from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
CITED = re.compile(r"`([^`\s]+\.(?:json|txt|png|csv))`")


def expand(name: str) -> list[str]:
    """Brace alternatives as the docs write them: `offline_{a,b}_{1,2}.json` -> 4 names."""
    m = re.search(r"\{([^{}]*)\}", name)
    if m is None:
        return [name]
    return [n for alt in m.group(1).split(",")
            for n in expand(name[: m.start()] + alt + name[m.end():])]


def cited_result_files(doc: Path) -> set[str]:
    """Names of result files a page cites: a backticked file name with an underscore or a
    folder in it (config.json and the like are model files, not results), globs and
    ranges left out, `git show <commit>:path` reduced to its path."""
    names = set()
    for token in CITED.findall(doc.read_text()):
        for name in expand(token):
            name = name.split(":")[-1]
            if "*" in name or ".." in name or name.startswith("_"):
                continue
            if "_" in name or "/" in name:
                names.add(name)
    return names


def committed(name: str) -> bool:
    if (ROOT / name).exists() or (RESULTS / name).exists():
        return True
    return any(RESULTS.rglob(Path(name).name))  # cited by its name inside a run folder


@pytest.mark.parametrize("doc", ["README.md", "docs/RESULTS.md"])
def test_cited_result_files_are_committed(doc: str) -> None:
    names = cited_result_files(ROOT / doc)
    assert len(names) > 10, "the page cites its result files"
    missing = sorted(n for n in names if not committed(n))
    assert not missing, f"{doc} cites result files that are not committed: {missing}"
