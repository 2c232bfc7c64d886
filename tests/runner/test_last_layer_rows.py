"""The last layer past its attention runs over the rows with logits only
(`LlamaForCausalLM.forward`'s and `PiecewiseGraphs.forward`'s `keep`): same logits as the
whole forward, every row's KV still written, through the real engine on the CPU."""

import pytest
import torch

from kvtier import LLM, SamplingParams

# The first prompt alone fills the first two steps (16 tokens each): steps without logits.
PROMPTS = [{"prompt_token_ids": [3 + i, 17, 42, 99, 7, 11] * n} for i, n in enumerate((6, 1, 2, 3))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def run(piecewise: bool, prune: bool) -> tuple[list[torch.Tensor], list[int], list[list[int]]]:
    """(logits of every step, rows the last layer ran past attention each step, tokens)."""
    llm = LLM("tiny-llama-gqa", load_format="dummy", attention_backend="torch",
              max_model_len=64, num_gpu_blocks=64, block_size=4, layers_per_block=2,
              max_num_batched_tokens=16,  # prompt chunks that end mid-prompt: no logits
              piecewise_graphs=piecewise)
    runner = llm.engine.executor
    model = runner.model
    logits: list[torch.Tensor] = []
    rows: list[int] = []
    head = model.compute_logits
    model.compute_logits = lambda h, out=None: logits.append(head(h, out)) or logits[-1]
    if runner.piecewise is not None:  # rows the pieces gather before the last piece
        gather = runner.piecewise._keep_rows
        runner.piecewise._keep_rows = lambda keep, n: rows.append(len(keep)) or gather(keep, n)
    else:
        last = model.layers[-1]
        after = last.after_attention
        last.after_attention = lambda out, res, ops: rows.append(len(out)) or after(out, res, ops)
    if not prune:  # the whole forward, as before: every row through the last layer
        forward = model.forward
        model.forward = lambda ids, pos, ctx, keep=None: select(forward(ids, pos, ctx), keep)
        if runner.piecewise is not None:
            pieces = runner.piecewise.forward
            runner.piecewise.forward = lambda *a: select(pieces(*a[:7]), a[7])
    out = llm.generate(PROMPTS, PARAMS)
    return logits, rows, [o.outputs[0].token_ids for o in out]


def select(hidden: torch.Tensor | None, keep: torch.Tensor | None) -> torch.Tensor | None:
    return hidden if hidden is None or keep is None else hidden[keep]


@pytest.mark.parametrize("piecewise", [False, True])
def test_last_layer_on_the_sampled_rows_gives_the_same_logits(piecewise):
    pruned, kept, tokens = run(piecewise, prune=True)
    whole, every, ref_tokens = run(piecewise, prune=False)
    assert tokens == ref_tokens
    assert len(pruned) == len(whole)
    for a, b in zip(pruned, whole):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-5)
    # The pruned run carried only the sampled rows past the last attention (on the CPU they
    # are not padded), and some steps had none; the whole forward carried every token.
    assert 0 in kept and max(kept) <= len(PROMPTS)
    assert len(kept) >= len(pruned)  # one count a forward (steps without logits too)
    if not piecewise:
        assert sum(every) > sum(kept) + sum(len(p["prompt_token_ids"]) for p in PROMPTS) // 2
