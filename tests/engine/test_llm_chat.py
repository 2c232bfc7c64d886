"""vLLM's `LLM.chat`: each conversation through the chat template, then generate; one
conversation or several, content as a string or OpenAI's text parts."""

from __future__ import annotations

import pytest

from kvtier.entrypoints.llm import LLM
from kvtier.sampling_params import SamplingParams

OPTS = dict(load_format="dummy", device="cpu", dtype="float32", max_model_len=128,
            num_gpu_blocks=64, block_size=16)
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-llama", **OPTS)


def test_chat_is_generate_over_the_templated_conversation(llm):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = llm.get_tokenizer().apply_chat_template(conv, add_generation_prompt=True)
    want = llm.generate({"prompt_token_ids": ids}, GREEDY)[0]
    got = llm.chat(conv, GREEDY)
    assert len(got) == 1 and got[0].prompt_token_ids == ids
    assert got[0].outputs[0].token_ids == want.outputs[0].token_ids


def test_several_conversations_and_text_parts(llm):
    a = [{"role": "user", "content": "one"}]
    b = [{"role": "user", "content": [{"type": "text", "text": "tw"}, {"type": "text", "text": "o"}]}]
    outs = llm.chat([a, b], GREEDY)
    same = llm.chat([{"role": "user", "content": "tw\no"}], GREEDY)[0]  # vLLM joins by newlines
    assert len(outs) == 2 and outs[1].prompt_token_ids == same.prompt_token_ids
    assert outs[1].outputs[0].token_ids == same.outputs[0].token_ids


def test_bad_conversations_are_refused_and_leave_nothing_queued(llm):
    for bad in ([], [{"content": "no role"}], [{"role": "wizard", "content": "x"}],
                [{"role": "user", "content": [{"type": "image_url"}]}],
                [[{"role": "user", "content": "x"}], []]):  # an empty one among several
        with pytest.raises(ValueError):
            llm.chat(bad, GREEDY)
    for own in ("messages", "add_generation_prompt", "not an identifier"):
        with pytest.raises(ValueError, match="chat_template_kwargs may not set"):
            llm.chat([{"role": "user", "content": "x"}], GREEDY, chat_template_kwargs={own: 1})
    with pytest.raises(ValueError, match="add_generation_prompt=False"):
        llm.chat([{"role": "user", "content": "x"}], GREEDY, continue_final_message=True)
    assert not llm.engine.has_unfinished_requests()


def test_a_template_for_one_call_leaves_the_engines(llm):
    conv = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
    before = llm.chat(conv, GREEDY)[0].prompt_token_ids
    template = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"
    own = llm.chat(conv, GREEDY, chat_template=template)[0]
    assert own.prompt_token_ids == llm.get_tokenizer().encode("user:one|assistant:two|")
    assert llm.chat(conv, GREEDY)[0].prompt_token_ids == before
