"""The host tier's flags, in the ecosystem's words, and the typed options they resolve to.

Primary spellings and their aliases (docs/HOST_TIER.md has the table):
  * size: vLLM's `--kv-offloading-size GIB` (primary: kvtier takes vLLM's names where vLLM
    has one); SGLang's `--hicache-size GIB` is an alias; `--hicache-ratio R` sizes it as R x
    the device KV pool instead (SGLang's default way). Setting either turns the tier on.
  * on/off: SGLang's `--enable-hierarchical-cache` (then the size defaults to
    `--hicache-ratio`'s default of 2x the device pool, as SGLang does).
  * `--hicache-write-policy {write_through, write_through_selective, write_back}`,
    `--hicache-io-backend {kernel, direct}`, `--hicache-mem-layout`: SGLang's (vLLM has
    none of them).
Layouts: kvtier's host pages are page-first (a page holds every layer of its group, one
contiguous span): `head_major` (SGLang's closest: `page_head`, also accepted for its
kernel-only `page_first`) and `block`, the device block's bytes (SGLang's
`page_first_direct`). SGLang's `layer_first` (one pool per layer) has no equivalent here and
is refused. Without a layout, `kernel` gets head_major and `direct` gets block (the only one
the copy engine can move).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any, Self

from kvtier.config import ConfigError
from kvtier.kernels.host_page_backends import IOBackend, PageIOConfig
from kvtier.kernels.host_page_io import DEFAULT_LOAD_PROGRAMS, HostPageLayout
from kvtier.kv.host_tier import HostTierConfig, WritePolicy

GiB = 2**30
DEFAULT_RATIO = 2.0  # SGLang's --hicache-ratio default
# A loading bound (balanced batches, docs/HOST_TIER.md): a step loads at most this many
# times the tokens it computes (SGLang's hybrid admission caps load/compute at 4.0).
# Measured on the H200, bounds 0-8 gave the same TTFT (few host hits to limit there):
# results/policies/strata_loading_bound_h200.json; the simulator's sweeps find no value
# better on every workload (results/policies/strata_loading_bound*_sim_h200.json).
DEFAULT_LOADING_BOUND = 4.0

_LAYOUTS = {"head_major": HostPageLayout.HEAD_MAJOR, "page_head": HostPageLayout.HEAD_MAJOR,
            "page_first": HostPageLayout.HEAD_MAJOR, "block": HostPageLayout.BLOCK,
            "page_first_direct": HostPageLayout.BLOCK}


@dataclass(frozen=True)
class HostTierArgs:
    enable_hierarchical_cache: bool = False
    kv_offloading_size: float | None = None  # GiB; alias --hicache-size
    hicache_ratio: float | None = None
    hicache_write_policy: str = WritePolicy.WRITE_THROUGH.value
    hicache_write_through_threshold: int = 2  # write_through_selective's device hits
    # The copy engine fed one batch call per transfer keeps link speed beside compute where
    # the kernel takes SMs from it (results/kernels/host_page_io_h200_runtime.json).
    hicache_io_backend: str = IOBackend.DIRECT.value
    hicache_mem_layout: str | None = None
    hicache_load_programs: int = DEFAULT_LOAD_PROGRAMS  # io backend kernel: a hit's loads
    # A host hit of fewer token blocks is computed: a load has a fixed cost a request on the
    # H200 that computing a short prefix undercuts; measured, loading loses at 64 tokens and
    # wins from 256 (results/policies/strata_breakeven_measured_h200.json).
    hicache_min_load_blocks: int = 8
    hicache_loading_bound: float = DEFAULT_LOADING_BOUND  # 0: no bound
    hicache_delayed_hits: bool = True  # wait for a prefix another request is computing
    # Bubble filling: load the hit of a request that waits anyway meanwhile. Off by default:
    # when it held requests back a step to prefetch them it cost TTFT on the H200 (variants c
    # and d of results/policies/strata_leval_shuffled_h200.json, strata_multiturn_h200.json);
    # prefetching only what waits anyway, the simulator finds it about even with the inline
    # layer-wise load (results/policies/strata_bubble_filling_sim32k_rate1.8_h200.json).
    hicache_prefetch: bool = False
    # vLLM's --kv-offloading-backend: kvtier's host tier is its "native" one; vLLM's other
    # choice, LMCache, is an external connector kvtier does not have.
    kv_offloading_backend: str = "native"

    def __post_init__(self) -> None:
        if self.kv_offloading_backend != "native":
            raise ConfigError(f"--kv-offloading-backend {self.kv_offloading_backend!r}: kvtier "
                              f"has no LMCache connector; its host tier is the native backend "
                              f"(give native or leave the flag out)")

    @property
    def enabled(self) -> bool:
        return (self.enable_hierarchical_cache or self.kv_offloading_size is not None
                or self.hicache_ratio is not None)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        a = parser.add_argument
        a("--enable-hierarchical-cache", action=argparse.BooleanOptionalAction, default=False,
          help="keep prefix-cache blocks the GPU evicts in a pinned host tier (SGLang)")
        a("--kv-offloading-size", "--hicache-size", dest="kv_offloading_size", type=float,
          help="host tier size in GiB (vLLM; SGLang's --hicache-size)")
        a("--kv-offloading-backend", choices=["native"], default=cls.kv_offloading_backend,
          help="vLLM's: native, kvtier's host tier (it has no LMCache connector)")
        a("--hicache-ratio", type=float,
          help=f"host tier = ratio x the device KV pool (default {DEFAULT_RATIO})")
        a("--hicache-write-policy", choices=[p.value for p in WritePolicy],
          default=cls.hicache_write_policy, help="when a device block gets its host copy")
        a("--hicache-write-through-threshold", type=int,
          default=cls.hicache_write_through_threshold,
          help="write_through_selective: device hits before a block is copied")
        a("--hicache-io-backend", choices=[b.value for b in IOBackend],
          default=cls.hicache_io_backend, help="kernel (Triton, UVA) or direct (copy engine)")
        a("--hicache-mem-layout", choices=[*_LAYOUTS, "layer_first"],
          help="host page layout (default: by io backend)")
        a("--hicache-load-programs", type=int, default=cls.hicache_load_programs,
          help="io backend kernel: programs of 1,024 threads that load a hit's blocks "
               "(stores and background copies take 2)")
        a("--hicache-min-load-blocks", type=int, default=cls.hicache_min_load_blocks,
          help="shorter host hits are computed, not loaded")
        a("--hicache-loading-bound", type=float, default=cls.hicache_loading_bound,
          help="a step loads at most this many tokens per token it computes (0: no bound)")
        a("--hicache-delayed-hits", action=argparse.BooleanOptionalAction,
          default=cls.hicache_delayed_hits,
          help="a request whose prefix another request is computing waits to hit it")
        a("--hicache-prefetch", action=argparse.BooleanOptionalAction,
          default=cls.hicache_prefetch,
          help="bubble filling: a host hit loads in a step's background while it waits")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> Self:
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})

    def layout(self, backend: IOBackend) -> HostPageLayout:
        name = self.hicache_mem_layout
        if name == "layer_first":
            raise ConfigError("--hicache-mem-layout layer_first: kvtier's host pages are "
                              "page-first; use head_major (page_head) or block "
                              "(page_first_direct)")
        if name is None:
            return HostPageLayout.HEAD_MAJOR if backend is IOBackend.KERNEL \
                else HostPageLayout.BLOCK
        if name not in _LAYOUTS:
            raise ConfigError(f"--hicache-mem-layout: unknown layout {name!r}, one of "
                              f"{sorted(_LAYOUTS)}")
        return _LAYOUTS[name]

    def resolve(self, num_gpu_blocks: int, page_bytes: int) -> HostTierOptions:
        """The typed options for a device pool of `num_gpu_blocks` blocks of `page_bytes`."""
        if not self.enabled:
            raise ConfigError("the host tier is off (--enable-hierarchical-cache, "
                              "--kv-offloading-size or --hicache-ratio turns it on)")
        if self.kv_offloading_size is not None and self.hicache_ratio is not None:
            raise ConfigError("give --kv-offloading-size (--hicache-size) or --hicache-ratio, "
                              "not both")
        if self.kv_offloading_size is not None:
            if self.kv_offloading_size <= 0:
                raise ConfigError(f"--kv-offloading-size must be > 0 GiB, got "
                                  f"{self.kv_offloading_size}")
            num_pages, option = int(self.kv_offloading_size * GiB // page_bytes), \
                "--kv-offloading-size"
        else:
            ratio = self.hicache_ratio if self.hicache_ratio is not None else DEFAULT_RATIO
            if ratio <= 0:
                raise ConfigError(f"--hicache-ratio must be > 0, got {ratio}")
            num_pages, option = int(ratio * num_gpu_blocks), "--hicache-ratio"
        if self.hicache_load_programs < 1:
            raise ConfigError(f"--hicache-load-programs must be >= 1, got "
                              f"{self.hicache_load_programs}")
        try:
            backend = IOBackend(self.hicache_io_backend)
            io = PageIOConfig(backend=backend, layout=self.layout(backend),
                              load_programs=self.hicache_load_programs)
            tier = HostTierConfig(num_pages=num_pages,
                                  write_policy=WritePolicy(self.hicache_write_policy),
                                  selective_hits=self.hicache_write_through_threshold,
                                  min_load_blocks=self.hicache_min_load_blocks,
                                  direct=backend is IOBackend.DIRECT)
        except ValueError as e:
            raise ConfigError(f"host tier: {e}") from e
        if self.hicache_loading_bound < 0:
            raise ConfigError(f"--hicache-loading-bound must be >= 0, got "
                              f"{self.hicache_loading_bound}")
        return HostTierOptions(tier, io, self.hicache_loading_bound, self.hicache_delayed_hits,
                               self.hicache_prefetch, option)


@dataclass(frozen=True)
class HostTierOptions:
    tier: HostTierConfig
    io: PageIOConfig
    loading_bound: float
    delayed_hits: bool
    prefetch: bool
    size_option: str  # the flag that sized it (named when the pool cannot be allocated)

    def describe(self) -> dict[str, Any]:
        return {"host_pages": self.tier.num_pages, "write_policy": self.tier.write_policy.value,
                "io_backend": self.io.backend.value, "layout": self.io.layout.value,
                "load_programs": self.io.load_programs,
                "loading_bound": self.loading_bound, "delayed_hits": self.delayed_hits,
                "prefetch": self.prefetch}
