"""No import cycles among the modules of kvtier/ and benchmarks/.

Every import statement counts, at module level or inside a function: an import deferred into
a function to dodge a cycle still ties the two modules together, each needing the other. A
cycle is broken by moving the shared piece to the lower module, or by passing what is needed
in explicitly (a protocol, an argument). Imports under `if TYPE_CHECKING:` do not count:
Python never runs them, and they name types only.

The graph is grimp's (the import graph import-linter checks contracts on); an import `a -> b`
closes a cycle when a chain of imports leads from b back to a.
"""

from __future__ import annotations

import grimp

PACKAGES = ("kvtier", "benchmarks")

# Known cycles still to be broken, each as its set of modules (none today).
EXPECTED: set[frozenset[str]] = set()


def import_cycles(graph: grimp.ImportGraph) -> set[tuple[str, ...]]:
    """One shortest cycle through every direct import that closes one, as (a, b, ..., a)
    starting from its alphabetically first module (so each cycle is listed once)."""
    cycles = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                ring = (importer, *back[:-1])
                first = ring.index(min(ring))
                cycles.add((*ring[first:], *ring[:first], ring[first]))
    return cycles


def _describe(graph: grimp.ImportGraph, cycle: tuple[str, ...]) -> str:
    links = []
    for a, b in zip(cycle, cycle[1:]):
        lines = [d["line_number"] for d in graph.get_import_details(importer=a, imported=b)]
        links.append(f"{a} (line {', '.join(map(str, lines))})")
    return " -> ".join([*links, cycle[-1]])


def test_no_import_cycles():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
    cycles = import_cycles(graph)
    unexpected = sorted(c for c in cycles if frozenset(c) not in EXPECTED)
    assert not unexpected, "import cycles:\n" + "\n".join(_describe(graph, c) for c in unexpected)
    gone = EXPECTED - {frozenset(c) for c in cycles}
    assert not gone, f"these expected cycles are gone: delete them from EXPECTED: {gone}"


def test_function_level_imports_count_and_type_checking_ones_do_not(tmp_path, monkeypatch):
    """The rules above, on a package written here: a imports b at module level; b imports a
    inside a function (a cycle) and c under TYPE_CHECKING; c imports b (no cycle)."""
    pkg = tmp_path / "cycle_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cycle_probe import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from cycle_probe import c\n"
        "def late():\n    from cycle_probe.a import b\n")
    (pkg / "c.py").write_text("import cycle_probe.b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cycle_probe", exclude_type_checking_imports=True, cache_dir=None)
    assert import_cycles(graph) == {("cycle_probe.a", "cycle_probe.b", "cycle_probe.a")}
