"""Run every ```python block of a Markdown file, each in a fresh interpreter in an empty
folder (so the installed package is what runs, not a source tree beside it).

    python .ci/readme_examples.py README.md

The blocks are read from the page itself, so the examples a reader copies are the ones
CI runs. Exits non-zero on the first block that fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(markdown: str) -> list[str]:
    return PYTHON_BLOCK.findall(markdown)


def main(argv: list[str]) -> int:
    page = Path(argv[1] if len(argv) > 1 else "README.md")
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    if not blocks:
        print(f"{page}: no ```python block", file=sys.stderr)
        return 1
    for i, code in enumerate(blocks, 1):
        with tempfile.TemporaryDirectory() as cwd:
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, "-c", code], cwd=cwd)
            took = time.monotonic() - t0
        status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        print(f"{page} python block {i}/{len(blocks)}: {status} in {took:.1f} s")
        if done.returncode:
            print(code, file=sys.stderr)
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
