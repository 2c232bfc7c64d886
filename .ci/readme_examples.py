"""Run every ```python block of a Markdown file, each in a fresh interpreter in an empty
folder (so the installed package is what runs, not a source tree beside it), then every
`kvtier ...` line of a ```bash block that ends in `# CPU`, with this interpreter's scripts.

    python .ci/readme_examples.py README.md

The examples are read from the page itself, so the ones a reader copies are the ones CI
runs. Exits non-zero on the first that fails.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)
CPU_COMMAND = re.compile(r"^(kvtier [^#]*?)\s+# CPU$", re.MULTILINE)


def python_blocks(markdown: str) -> list[str]:
    return PYTHON_BLOCK.findall(markdown)


def cpu_commands(markdown: str) -> list[str]:
    return [c for block in BASH_BLOCK.findall(markdown) for c in CPU_COMMAND.findall(block)]


def _run(argv: list[str], label: str, env: dict[str, str]) -> int:
    with tempfile.TemporaryDirectory() as cwd:
        t0 = time.monotonic()
        done = subprocess.run(argv, cwd=cwd, env=env)
        took = time.monotonic() - t0
    status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
    print(f"{label}: {status} in {took:.1f} s")
    return done.returncode


def main(argv: list[str]) -> int:
    page = Path(argv[1] if len(argv) > 1 else "README.md")
    text = page.read_text(encoding="utf-8")
    blocks, commands = python_blocks(text), cpu_commands(text)
    if not blocks:
        print(f"{page}: no ```python block", file=sys.stderr)
        return 1
    # The `kvtier` script installed beside this interpreter, not one elsewhere on PATH.
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    runs = [([sys.executable, "-c", code], f"python block {i}/{len(blocks)}", code)
            for i, code in enumerate(blocks, 1)]
    runs += [(shlex.split(c), c, c) for c in commands]
    for cmd, label, shown in runs:
        if rc := _run(cmd, f"{page} {label}", env):
            print(shown, file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
