"""Completions and chat through the official `openai` client, streamed and not."""

from __future__ import annotations

import httpx
import openai
import pytest

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server

PROMPT = "The quick brown fox jumps over the lazy dog"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def live(request, tiny_model_dir):
    """The engine one step at a time, and with async scheduling (outputs one step behind
    the GPU): the API must not tell them apart."""
    srv = start_server(build_app(make_engine(tiny_model_dir, async_scheduling=request.param)))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(live):
    with openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_and_health(live, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(live.base_url + "/health").status_code == 200


def test_completion(live, client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert out.object == "text_completion" and choice.finish_reason == "length"
    prompt_len = len(live.engine.tokenizer.encode(PROMPT))
    assert out.usage.prompt_tokens == prompt_len
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == prompt_len + 12
    assert isinstance(choice.text, str)


def test_streamed_completion_equals_unstreamed(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.text and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_chat(live, client):
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10,
                                         temperature=0, extra_body={"ignore_eos": True})
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == 10
    # The prompt is the model's chat template applied to the messages.
    expected_prompt = live.engine.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(expected_prompt)


def test_streamed_chat_equals_unstreamed(client):
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole and text
    assert chunks[-1].usage.completion_tokens == 20 and chunks[-1].usage.prompt_tokens > 0


def test_completion_matches_engine_directly(live, client):
    """The server adds nothing: the same greedy request straight to the engine agrees."""
    from kvtier.sampling_params import SamplingParams

    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                    extra_body={"ignore_eos": True})

    def direct(engine):
        ids = engine.tokenizer.encode(PROMPT)
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        engine.add_request("direct-check", ids, params)
        final = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.request_id == "direct-check" and o.finished:
                    final = o
        return final.outputs[0].text

    assert live.call(direct) == out.choices[0].text


def test_n_and_seed(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=1234, n=3,
              extra_body={"ignore_eos": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # seeded: reproducible
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(3)] == [c.text for c in a.choices]


@pytest.mark.parametrize("prompts", [[PROMPT, "Hello", "A"], [[5, 6, 7], [8], [9, 10]]])
def test_batch_prompts(client, prompts):
    out = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2,
                                    extra_body={"ignore_eos": True})
    assert sorted(c.index for c in out.choices) == list(range(6))
    assert out.usage.completion_tokens == 6 * 4
    # choice prompt_index * n + i holds prompt prompt_index's completion
    single = client.completions.create(model=MODEL, prompt=prompts[1], max_tokens=4, temperature=0,
                                       extra_body={"ignore_eos": True})
    by_index = {c.index: c.text for c in out.choices}
    assert by_index[2] == by_index[3] == single.choices[0].text


def test_stop_string(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[5:9] if len(base) > 9 else None
    if not stop or not stop.strip():
        pytest.skip("greedy text too short/blank to pick a stop string")
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop],
              extra_body={"ignore_eos": True})
    out = client.completions.create(**kw).choices[0]
    assert out.finish_reason == "stop" and out.text == base[: base.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    assert streamed == out.text  # no part of the stop string leaked into the stream


def test_completion_logprobs(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                                    logprobs=3, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 1 <= len(top) <= 3
        assert chosen == pytest.approx(max(top.values()), abs=1e-4)  # greedy picks the top one
    assert lp.text_offset == sorted(lp.text_offset)


def test_completion_top_logprobs_hold_the_sampled_token(client):
    """OpenAI's legacy completions (and vLLM): top_logprobs always hold the sampled token,
    so up to logprobs + 1 entries; sampled hot, it is mostly not among the top one."""
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=5.0,
                                    seed=3, logprobs=1, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 2 and top[token] == pytest.approx(chosen)
    assert any(len(top) == 2 for top in lp.top_logprobs)


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_text_offsets_equal_unstreamed(client, echo):
    """A long stop string holds text back while the tokens' logprobs go out: the streamed
    text_offset still counts the tokens' text, as the whole response's does."""
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=1, echo=echo,
              stop=["\x00" * 8], extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].logprobs
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
    assert [o for c in chunks if c.logprobs for o in c.logprobs.text_offset] == whole.text_offset
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == whole.tokens


def test_chat_logprobs(client):
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0,
                                         logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_metrics_exposed(live, client):
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, extra_body={"ignore_eos": True})
    text = httpx.get(live.base_url + "/metrics").text
    for name in ("kvtier:num_requests_running", "kvtier:num_requests_waiting",
                 "kvtier:num_requests_swapped", 'kvtier:kv_blocks_used{tier="gpu"}',
                 'kvtier:kv_blocks_used{tier="host"}', "kvtier:num_preemptions_total",
                 "kvtier:recomputed_tokens_total", "kvtier:prompt_tokens_total",
                 "kvtier:generation_tokens_total", "kvtier:time_to_first_token_seconds_count",
                 "kvtier:time_per_output_token_seconds_count", "kvtier:e2e_request_latency_seconds_count",
                 "kvtier:request_queue_time_seconds_count", "kvtier:request_prefill_time_seconds_count",
                 "kvtier:request_decode_time_seconds_count",
                 "kvtier:request_inference_time_seconds_count",
                 'kvtier:request_success_total{finished_reason="length"}'):
        assert name in text, name
    gen = [line for line in text.splitlines() if line.startswith("kvtier:generation_tokens_total")]
    assert float(gen[0].split()[-1]) > 0
    for phase in ("queue", "prefill", "decode", "inference"):  # observed, not only declared
        count = [line for line in text.splitlines()
                 if line.startswith(f"kvtier:request_{phase}_time_seconds_count")]
        assert float(count[0].split()[-1]) >= 1, phase
    assert_engine_clean(live)


def test_penalties_and_logit_bias_reach_the_sampler(live, client):
    """The client's own fields: a strong bias makes every token the biased one; the
    penalties change a greedy completion that repeats itself, streamed or not alike."""
    tok = live.engine.tokenizer
    token = tok.encode(" fox")[-1]
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0,
              extra_body={"ignore_eos": True})
    biased = client.completions.create(logit_bias={str(token): 100}, **kw)
    assert biased.choices[0].text == tok.decode([token] * 24)
    plain = client.completions.create(logprobs=0, **kw).choices[0]
    assert len(set(plain.logprobs.tokens)) < 24  # greedy repeats itself here
    pkw = {**kw, "frequency_penalty": 2.0, "presence_penalty": 1.0,
           "extra_body": {**kw["extra_body"], "repetition_penalty": 1.5}}
    whole = client.completions.create(**pkw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **pkw)
                       if c.choices)
    assert whole == streamed and whole != plain.text
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6,
                                          temperature=0, logit_bias={str(token): 100},
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == tok.decode([token] * 6)


def test_allowed_token_ids_hold_every_token(live, client):
    """vLLM's allowed_token_ids through the client's extra_body: completions and chat draw
    only those ids, greedy or sampled."""
    tok = live.engine.tokenizer
    allowed = sorted({tok.encode(" fox")[-1], tok.encode(" dog")[-1]})
    extra = {"ignore_eos": True, "allowed_token_ids": allowed, "return_token_ids": True}
    for temperature in (0, 1.0):
        got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                        temperature=temperature, extra_body=extra)
        assert set(got.choices[0].model_extra["token_ids"]) <= set(allowed)
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5,
                                          temperature=0, extra_body=extra)
    assert set(chat.choices[0].model_extra["token_ids"]) <= set(allowed)


@pytest.mark.parametrize("prompt", [PROMPT, [11, 12, 13, 14, 15, 16]], ids=["text", "ids"])
def test_echo_puts_the_prompt_and_its_logprobs_first(live, client, prompt):
    """OpenAI's echo as vLLM serves it (lm-eval's loglikelihood calls: echo, logprobs,
    max_tokens 1): the prompt's text, then the completion; its tokens' logprobs, the first
    none, then the completion's; streamed alike."""
    tok = live.engine.tokenizer
    ids = tok.encode(prompt) if isinstance(prompt, str) else prompt
    text = prompt if isinstance(prompt, str) else tok.decode(ids)
    kw = dict(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, logprobs=2,
              extra_body={"ignore_eos": True})
    plain = client.completions.create(**kw).choices[0]
    echoed = client.completions.create(echo=True, **kw).choices[0]
    assert echoed.text == text + plain.text
    lp = echoed.logprobs
    assert len(lp.tokens) == len(ids) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:len(ids)])
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:len(ids)])  # the token's + top 2
    assert lp.token_logprobs[len(ids):] == plain.logprobs.token_logprobs
    assert lp.text_offset[len(ids):] == [o + len(text) for o in plain.logprobs.text_offset]
    streamed = [c.choices[0] for c in client.completions.create(echo=True, stream=True, **kw)
                if c.choices]
    assert "".join(c.text for c in streamed) == echoed.text
    assert [v for c in streamed for v in c.logprobs.token_logprobs] == lp.token_logprobs
    two = client.completions.create(echo=True, n=2, **kw).choices  # one scoring for both
    assert [c.logprobs.token_logprobs for c in two] == [lp.token_logprobs] * 2
    by_choice: dict[int, list] = {0: [], 1: []}
    for chunk in client.completions.create(echo=True, n=2, stream=True, **kw):
        for c in chunk.choices:
            by_choice[c.index].append(c)
    for chunks in by_choice.values():
        assert chunks[0].text.startswith(text)
        assert [v for c in chunks for v in c.logprobs.token_logprobs] == lp.token_logprobs
    bare = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, echo=True,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert bare.choices[0].text.startswith(text) and bare.choices[0].logprobs is None
