"""Shared code reaches a memory system only through hooks: outside kvtier/policies/ no
module names one. The host tier's flags are SGLang's own spelling (`--hicache-*`), which
its users type, so kvtier/offload/args.py may say `hicache` and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "kvtier"
NAMES = re.compile(r"\b(ellm|hcache|neo|directkv|strata|hicache)\b", re.IGNORECASE)
FLAG_SPELLING = {"offload/args.py": {"hicache"}}


def test_no_shared_module_names_a_memory_system():
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("policies/"):
            continue
        names = {m.lower() for m in NAMES.findall(path.read_text())}
        extra = names - FLAG_SPELLING.get(rel, set())
        if extra:
            found[rel] = sorted(extra)
    assert not found, f"name a system outside kvtier/policies/ (add a hook): {found}"
