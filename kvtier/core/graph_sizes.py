"""Which padded sizes get a CUDA graph: the runner captures at them and the cost model prices
a step at the size it pads to, so both read these two functions (pure, no torch)."""

from __future__ import annotations


def graph_batch_sizes(max_num_seqs: int, max_graph_batch_size: int = 512) -> list[int]:
    """Padded decode batch sizes with a full-model graph: 1, 2, 4, every 8 up to 128, then
    every 4 up to the cap (vLLM's `max_cudagraph_capture_size`, SGLang's `cuda_graph_max_bs`).
    Below 128 rows a step streams its weights whatever its rows, so padding costs nothing
    there; above, the linear layers turn compute bound and a padded row costs as much as a
    real one, hence the finer steps. The graphs share one memory pool and one logits buffer,
    so more sizes cost capture time, not memory (measured in
    results/offline/offline_ab_{e7626d1,a4b588d}_{1,2}.json)."""
    sizes = [1, 2, 4] + list(range(8, min(128, max_graph_batch_size) + 1, 8))
    sizes += list(range(132, max_graph_batch_size + 1, 4))
    cap = min(max_num_seqs, max_graph_batch_size)
    kept = [s for s in sizes if s < cap]
    return kept + [cap]  # the largest batch the scheduler can form has a graph of its own


def piecewise_sizes(max_tokens: int) -> list[int]:
    """Padded token counts the piecewise graphs are captured at: every 32 up to 512, then a
    step of 1/16 to 1/8 of the size (64 to 1024, 128 to 2048, ...). A step pads to the next
    size, so at most ~12 % of its GEMM rows are padding (powers of two would waste up to
    half)."""
    sizes, t = [], 32
    while t < max_tokens:
        sizes.append(t)
        t += max(32, 1 << max(0, (t - 1).bit_length() - 4))
    return [*sizes, max_tokens]
