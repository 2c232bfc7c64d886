"""Memory systems by name (`kv_policy=` / `--kv-policy`). A system's package registers
itself when imported (`register_system(MySystem)`); kvtier/policies/__init__.py imports the
built-in ones."""

from __future__ import annotations

from kvtier.config import ConfigError, EngineConfig, SystemOptions
from kvtier.costmodel.settings import CostModelConfig, engine_cost_config
from kvtier.policies.base import KVPolicy, MemorySystem
from kvtier.policies.options import SystemArgs

_SYSTEMS: dict[str, MemorySystem] = {}


def register_system(cls: type[MemorySystem]) -> type[MemorySystem]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a name")
    cls.policy.name = cls.name
    _SYSTEMS[cls.name] = cls()
    return cls


def unregister_system(name: str) -> None:
    """Forget a system (tests that register one of their own clean up with it)."""
    _SYSTEMS.pop(name, None)


def get_system(name: str) -> MemorySystem:
    if name not in _SYSTEMS:
        raise ConfigError(f"unknown kv policy {name!r}; available: {', '.join(policy_names())}")
    return _SYSTEMS[name]


def get_policy(name: str, options: SystemOptions | None = None) -> KVPolicy:
    return get_system(name).make_policy(options if options is not None else SystemOptions())


def system_cost_config(config: EngineConfig, block_bytes: int,
                       num_gpus: int = 1) -> CostModelConfig:
    """`engine_cost_config` with what this config's memory system says of its steps."""
    options = get_system(config.kv_policy).cost_model_options(config)
    return engine_cost_config(config, block_bytes, num_gpus, system_options=options)


def policy_names() -> list[str]:
    return sorted(_SYSTEMS)


def demo_policies() -> list[str]:
    """The systems `make run` compares, in their `demo_order`."""
    shown = [(s.demo_order, name) for name, s in _SYSTEMS.items() if s.demo_order is not None]
    return [name for _, name in sorted(shown)]


def system_args() -> dict[str, type[SystemArgs]]:
    """Each registered system's flags class, by system name."""
    return {name: system.args for name, system in sorted(_SYSTEMS.items())}


def policy_flag_defaults() -> dict[str, object]:
    """Keyword -> default of every registered system's flags."""
    out: dict[str, object] = {}
    for args_cls in system_args().values():
        out.update({k: v for k, v in args_cls.defaults().items() if k not in out})
    return out
