"""A non-empty text that encodes to no tokens is refused where it enters, never run.

A tokenizer with a Whitespace pre-tokenizer (the HF `tokenizers` quick-tour kind) and no
BOS encodes whitespace to []; such a prompt used to reach the runner and fail its step.
"""

from __future__ import annotations

import pytest

from kvtier import LLM, SamplingParams
from kvtier.bench.request import LengthLimits
from kvtier.bench.sharegpt import sample_sharegpt
from kvtier.sampling_params import InvalidRequestError
from kvtier.tokenizer import BPETokenizer
from tests.hf_models import save_tiny_model

BLANK = " \n\t "
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def save_whitespace_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    tok.train_from_iterator(["hello world, the KV cache lives in a memory hierarchy"] * 50, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>", unk_token="<unk>").save_pretrained(path)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("whitespace_tok")
    save_tiny_model("llama-gqa", path)
    save_whitespace_tokenizer(path)
    llm = LLM(str(path), max_model_len=128)
    assert llm.get_tokenizer().encode(BLANK) == []
    return llm


def test_offline_generate_refuses_a_prompt_without_tokens(llm):
    with pytest.raises(InvalidRequestError, match="no tokens"):
        llm.generate(BLANK, PARAMS)
    out = llm.generate("hello world", PARAMS)  # the engine is unharmed
    assert len(out[0].outputs[0].token_ids) == 4


def test_a_bad_prompt_in_a_batch_leaves_nothing_queued(llm):
    with pytest.raises(InvalidRequestError, match="no tokens"):
        llm.generate(["hello world", BLANK], PARAMS)
    assert not llm.engine.has_unfinished_requests()
    assert len(llm.generate(["the cache"], PARAMS)) == 1


def test_engine_add_request_refuses_it(llm):
    with pytest.raises(InvalidRequestError, match="no tokens"):
        llm.engine.add_request("blank", BLANK, PARAMS)
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.engine.add_request("ids", [], PARAMS)


def test_bench_workload_skips_prompts_without_tokens():
    """Even with --min-prompt-len 0, a conversation whose prompt has no tokens is dropped
    (it used to stop the whole workload build)."""
    pairs = [("", "a reply of a few words"), ("a prompt of a few words", "a reply of a few words")]
    requests = sample_sharegpt(pairs, BPETokenizer(32000), 1, seed=0,
                               limits=LengthLimits(min_prompt_len=0))
    assert len(requests) == 1 and requests[0].prompt_len > 0
    assert not LengthLimits(min_prompt_len=0).accepts(0, 10)
