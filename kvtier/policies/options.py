"""A memory system's command-line flags: a frozen dataclass whose fields are the flags.

Field `name` of a system whose `prefix` is "ellm" is the flag `--ellm-name` and the
keyword `ellm_name` of EngineArgs and LLM(...); metadata {"dest": "x"} names it `--x` / `x`
instead; metadata {"help": ...} is the flag's help. `aliases` are hidden extra spellings.
EngineArgs registers every registered system's flags (kvtier/engine/args.py), so a system
adds flags without editing shared code.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar


@dataclass(frozen=True)
class SystemArgs:
    prefix: ClassVar[str] = ""
    aliases: ClassVar[tuple[tuple[str, str], ...]] = ()  # (flag, dest), hidden from --help

    @classmethod
    def dests(cls) -> dict[str, str]:
        """Field name -> keyword / argparse dest."""
        return {f.name: f.metadata.get("dest", f"{cls.prefix}_{f.name}") for f in fields(cls)}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Keyword -> default value."""
        dests = cls.dests()
        return {dests[f.name]: f.default for f in fields(cls) if f.default is not MISSING}

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, taken: set[str]) -> None:
        """Its flags, except those another system registered already (`taken` dests)."""
        dests = cls.dests()
        for f in fields(cls):
            dest = dests[f.name]
            if dest in taken:
                continue
            taken.add(dest)
            flag = "--" + dest.replace("_", "-")
            help_ = f.metadata.get("help")
            if "bool" in str(f.type):
                parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                    default=f.default, help=help_)
            else:
                parser.add_argument(flag, dest=dest, type=arg_type(f.type), default=f.default,
                                    help=help_)
        for flag, dest in cls.aliases:
            parser.add_argument(flag, dest=dest, help=argparse.SUPPRESS)

    @classmethod
    def from_values(cls, values: dict[str, Any]):
        """Its args from keyword values (missing ones take their defaults)."""
        dests = cls.dests()
        return cls(**{name: values[dest] for name, dest in dests.items() if dest in values})


@dataclass(frozen=True)
class NoArgs(SystemArgs):
    """A system without flags."""


def arg_type(annotation: Any):
    text = str(annotation)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str
