"""Which part of a model one tensor-parallel rank holds (Megatron's split, as vLLM's).

    column-parallel  q|k|v, gate|up   each rank: its heads' rows / its 1/N of the MLP rows
    row-parallel     o, down          each rank: the matching columns; outputs all-reduced
    vocab-parallel   embed, lm_head   each rank: ceil(V/N) rows (the last one padded)
    KV heads         split N ways, or replicated when N > num_kv_heads (each rank keeps one,
                     the head its query heads read)

Pure integer arithmetic: the runner's loading and the cost model's per-GPU shapes share it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvtier.config import ConfigError, ModelConfig


def check_tp(mc: ModelConfig, tp: int) -> None:
    """Clear error when `mc` does not split `tp` ways."""
    if tp < 1:
        raise ConfigError(f"tensor_parallel_size must be >= 1, got {tp}")
    if mc.num_heads % tp or mc.intermediate_size % tp:
        raise ConfigError(f"{mc.name}: {mc.num_heads} attention heads and {mc.intermediate_size} "
                          f"MLP columns must both divide by tensor_parallel_size {tp}")
    kv = mc.num_kv_heads
    if (kv % tp) if tp <= kv else (tp % kv):
        raise ConfigError(f"{mc.name}: {kv} KV heads must divide by tensor_parallel_size {tp} "
                          f"(or {tp} by them, to replicate each over several ranks)")


@dataclass(frozen=True)
class TPShard:
    """Rank `rank` of `size` over model `mc`: the index ranges it holds."""

    mc: ModelConfig
    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        check_tp(self.mc, self.size)
        if not 0 <= self.rank < self.size:
            raise ConfigError(f"rank {self.rank} outside tensor_parallel_size {self.size}")

    @property
    def num_heads(self) -> int:
        return self.mc.num_heads // self.size

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.mc.num_kv_heads // self.size)

    @property
    def kv_replicas(self) -> int:
        """Ranks that hold the same KV head (1 unless tp > num_kv_heads)."""
        return max(1, self.size // self.mc.num_kv_heads)

    @property
    def intermediate(self) -> int:
        return self.mc.intermediate_size // self.size

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.mc.vocab_size // self.size)

    def heads(self) -> range:
        return range(self.rank * self.num_heads, (self.rank + 1) * self.num_heads)

    def kv_heads(self) -> range:
        """The KV heads this rank's query heads read (GQA: query head j reads j // group)."""
        first = self.rank * self.mc.num_kv_heads // self.size
        return range(first, first + self.num_kv_heads)

    def q_cols(self) -> range:
        """This rank's columns of q (rows of the q projection, columns of o)."""
        d = self.mc.head_dim
        return range(self.heads().start * d, self.heads().stop * d)

    def kv_cols(self) -> range:
        d = self.mc.head_dim
        return range(self.kv_heads().start * d, self.kv_heads().stop * d)

    def mlp_cols(self) -> range:
        return range(self.rank * self.intermediate, (self.rank + 1) * self.intermediate)

    def vocab(self) -> range:
        """The vocabulary entries this rank holds (the last rank may hold fewer than
        `vocab_per_rank`: its remaining rows are zero padding)."""
        start = self.rank * self.vocab_per_rank
        return range(min(start, self.mc.vocab_size),
                     min(start + self.vocab_per_rank, self.mc.vocab_size))

    def config(self) -> ModelConfig:
        """The per-rank architecture: the layers' shapes of one shard (the vocabulary stays
        whole: the logits are gathered before sampling)."""
        return replace(self.mc, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                       intermediate_size=self.intermediate)
