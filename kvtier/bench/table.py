"""The comparison table printed after a benchmark: one row per policy, then each later
policy's ratios to the first (latencies in ms)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from kvtier.bench.experiment import PolicyResult

Getter = Callable[[PolicyResult], float | None]


def _ms(name: str, q: str) -> Getter:
    return lambda r: (getattr(d, q) * 1000.0 if (d := getattr(r.summary, name)) is not None else None)


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


# (header, getter, format)
COLUMNS: tuple[tuple[str, Getter, str], ...] = (
    ("req/s", lambda r: r.summary.request_throughput, "{:.2f}"),
    ("out tok/s", lambda r: r.summary.output_throughput, "{:.1f}"),
    ("TTFT p50", _ms("ttft_s", "p50"), "{:.0f}"),
    ("TTFT p99", _ms("ttft_s", "p99"), "{:.0f}"),
    ("TPOT p50", _ms("tpot_s", "p50"), "{:.1f}"),
    ("TPOT p99", _ms("tpot_s", "p99"), "{:.1f}"),
    ("E2E p50", _ms("e2e_s", "p50"), "{:.0f}"),
    ("SLO % sent", lambda r: _pct(r.summary.slo_attainment), "{:.1f}"),
    ("goodput", lambda r: r.goodput.rate if r.goodput else None, "{:.2f}"),
    ("preempt", lambda r: r.engine.get("num_preemptions"), "{:.0f}"),
    ("swap-out blk", lambda r: r.engine.get("num_swap_out_blocks"), "{:.0f}"),
    ("recomp tok", lambda r: r.engine.get("num_recomputed_tokens"), "{:.0f}"),
    ("prefix tok", lambda r: r.engine.get("num_prefix_recompute_tokens"), "{:.0f}"),
    ("KV use %", lambda r: _pct(r.engine.get("mean_gpu_kv_use")), "{:.0f}"),
)


# Shown when the backend reports each request's prefix-cache hit (kvtier's do).
CACHE_COLUMNS: tuple[tuple[str, Getter, str], ...] = (
    ("hit %", lambda r: _pct(r.summary.prefix_cache_hit_rate), "{:.1f}"),
    ("cached tok", lambda r: r.summary.num_cached_tokens, "{:.0f}"),
)

# Shown when a time limit cut a run: what became of the requests, the strict attainment.
LIMIT_COLUMNS: tuple[tuple[str, Getter, str], ...] = (
    ("sent", lambda r: r.summary.num_sent, "{:.0f}"),
    ("aborted", lambda r: r.summary.num_aborted_at_limit, "{:.0f}"),
    ("not sent", lambda r: r.summary.num_not_sent, "{:.0f}"),
    ("SLO % all", lambda r: _pct(r.summary.slo_attainment_all), "{:.1f}"),
)
CAPTION = "SLO % sent: of the requests sent, failed and aborted ones as misses"
CAPTION_ALL = "; SLO % all: of every request, the unsent ones as misses too"


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def _columns(results: list[PolicyResult]) -> tuple[tuple[str, Getter, str], ...]:
    columns = COLUMNS
    if any(r.summary.num_cached_tokens is not None for r in results):
        columns += CACHE_COLUMNS
    if any(r.summary.num_not_sent or r.summary.num_aborted_at_limit for r in results):
        columns += LIMIT_COLUMNS
    return columns


def comparison_table(results: list[PolicyResult], title: str = "kvtier bench") -> Table:
    columns = _columns(results)
    with_slo = any(r.summary.slo_attainment is not None for r in results)
    caption = CAPTION + (CAPTION_ALL if LIMIT_COLUMNS[0] in columns else "")
    table = Table(title=title, caption=caption if with_slo else None)
    table.add_column("policy", style="bold", no_wrap=True)
    for header, _, _ in columns:
        table.add_column(header, justify="right")
    first = results[0]
    for r in results:
        table.add_row(r.policy, *(_fmt(get(r), fmt) for _, get, fmt in columns))
    for r in results[1:]:
        ratios = [_ratio(get(r), get(first)) for _, get, _ in columns]
        table.add_row(f"{r.policy} / {first.policy}", *ratios, style="dim")
    return table


def print_table(results: list[PolicyResult], title: str = "kvtier bench", console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped (CI, logs): wide, not rich's 80-column default
            console = Console(width=240)
    console.print(comparison_table(results, title))
