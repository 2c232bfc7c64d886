"""Every result file the README, docs/RESULTS.md, benchmarks/README.md and the code cite is
committed under results/<subject>/: a figure is shown only with the file it came from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
DOCS = ["README.md", "docs/RESULTS.md", "benchmarks/README.md"]
CITED = re.compile(r"`([^`\s]+\.(?:json|txt|png|csv|md))`")
# A path into results/ written anywhere in code or prose (a docstring's citation).
RESULT_PATH = re.compile(r"(?<![\w/.])results/[\w./{},*-]*[\w/}*]")
RESULT_SUFFIXES = {".json", ".txt", ".png", ".csv"}
# `git show <commit>:<path>` cites an earlier version at the path it had then.
GIT_SHOW = re.compile(r"git\s+show\s+[0-9a-f]{7,40}:\S+")


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
    ranges left out, `git show <commit>:path` reduced to its path. Markdown pages of the
    repository (docs/*.md, README.md) are pages, not results."""
    names = set()
    for token in CITED.findall(doc.read_text()):
        for name in expand(token):
            if ":" in name:  # `git show <commit>:path`: the file still committed today
                name = Path(name.split(":")[-1]).name
            if "*" in name or ".." in name or name.startswith("_"):
                continue
            if name.endswith(".md") and not name.startswith("results/"):
                continue
            if "_" in name or "/" in name:
                names.add(name)
    return names


def committed(name: str) -> bool:
    """A path is committed where it says; a bare name somewhere under results/ (the pages
    cite a file by its name inside the subject's or run's folder they name)."""
    if "/" in name:
        return (ROOT / name).exists()
    return any(RESULTS.rglob(name))


@pytest.mark.parametrize("doc", DOCS)
def test_cited_result_files_are_committed(doc: str) -> None:
    names = cited_result_files(ROOT / doc)
    assert len(names) > 10, "the page cites its result files"
    missing = sorted(n for n in names if not committed(n))
    assert not missing, f"{doc} cites result files that are not committed: {missing}"


def source_files() -> list[Path]:
    """Code and pages, the reports written beside the results included."""
    return [p for top in ("kvtier", "benchmarks", "tests", "docs", "results")
            for p in (ROOT / top).rglob("*") if p.suffix in {".py", ".md", ".sh"}] + [
        ROOT / "README.md"]


def test_result_paths_in_code_and_pages_exist() -> None:
    """Every `results/...` path a docstring, comment, default or page cites, globs
    included, names something committed (a command's `--out` / `--plot` names a file the
    command writes, which a fresh run need not have committed)."""
    missing = []
    for path in source_files():
        text = GIT_SHOW.sub("", path.read_text())
        for m in RESULT_PATH.finditer(text):
            if re.search(r"--(?:out|plot)[\s\\]*$", text[max(0, m.start() - 12):m.start()]):
                continue
            for name in expand(m.group(0).rstrip(".")):
                found = list(ROOT.glob(name)) if "*" in name else [ROOT / name]
                if not found or not all(f.exists() for f in found):
                    missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_no_citation_of_the_old_results_folder() -> None:
    stale = [str(p.relative_to(ROOT)) for p in source_files()
             if p != Path(__file__).resolve()
             and "benchmarks/results" in GIT_SHOW.sub("", p.read_text())]
    assert not stale, f"benchmarks/results/ moved to results/<subject>/: {stale}"


def test_results_live_outside_the_source_folder() -> None:
    """benchmarks/ holds code and its index; measurements sit in results/<subject>/."""
    strays = [str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*")
              if p.suffix in RESULT_SUFFIXES and "__pycache__" not in p.parts]
    assert not strays, strays
    loose = [p.name for p in RESULTS.iterdir() if p.is_file()]
    assert not loose, f"results/ holds one folder per subject, not loose files: {loose}"
