"""/generate as SGLang's own clients read it, beyond test_sglang_generate.py: the fields
SGLang answers that a client may index (each stream event's `output_ids`, `meta_info.id`
from the request's `rid`), per-prompt `sampling_params`, and a client gone mid-stream."""

from __future__ import annotations

import json

import httpx
import pytest

from kvtier.server.app import build_app
from tests.server.conftest import assert_engine_clean, make_engine, serve_until_clean
from tests.server.test_sglang_generate import generate

TEXT = "The quick brown fox"
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def live(tiny_model_dir):
    yield from serve_until_clean(build_app(make_engine(tiny_model_dir)))


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.base_url, timeout=60) as c:
        yield c


def stream_events(http, **body) -> list[dict]:
    with http.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        lines = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_each_stream_event_holds_the_output_ids_so_far(http):
    """SGLang's events carry `output_ids` beside `text`, both the sequence's so far."""
    whole = generate(http, text=TEXT, sampling_params=GREEDY)
    events = stream_events(http, text=TEXT, sampling_params=GREEDY)
    ids = [e["output_ids"] for e in events]
    assert all(b[:len(a)] == a for a, b in zip(ids, ids[1:]))
    assert ids[-1] == whole["output_ids"]
    assert all(len(e["output_ids"]) == e["meta_info"]["completion_tokens"] for e in events)


def test_rid_is_the_meta_info_id(http):
    """SGLang's `rid` names the request: one prompt's id is it, a batch's `{rid}_{i}`, or
    the list's entries."""
    one = generate(http, text=TEXT, rid="mine", sampling_params=GREEDY)
    assert one["meta_info"]["id"] == "mine"
    events = stream_events(http, text=TEXT, rid="streamed", sampling_params=GREEDY)
    assert {e["meta_info"]["id"] for e in events} == {"streamed"}
    batch = generate(http, text=[TEXT, "Hello"], rid="b", sampling_params=GREEDY)
    assert [b["meta_info"]["id"] for b in batch] == ["b_0", "b_1"]
    listed = generate(http, text=[TEXT, "Hello"], rid=["x", "y"], sampling_params=GREEDY)
    assert [b["meta_info"]["id"] for b in listed] == ["x", "y"]
    several = generate(http, text=TEXT, rid="n", sampling_params={**GREEDY, "n": 2})
    assert [s["meta_info"]["id"] for s in several] == ["n_0", "n_1"]


def test_a_rid_list_of_the_wrong_length_is_400(http):
    resp = http.post("/generate", json={"text": [TEXT, "Hello"], "rid": ["x"]})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "rid"


def test_a_batch_takes_a_list_of_sampling_params(http):
    """SGLang's batch may give `sampling_params` a prompt (clients often send the same
    dict for each); kvtier runs a batch under one, so different ones are a 400."""
    batch = generate(http, text=[TEXT, "Hello"], sampling_params=[GREEDY, GREEDY])
    assert [b["meta_info"]["completion_tokens"] for b in batch] == [6, 6]
    for body in ({"text": [TEXT, "Hello"], "sampling_params": [GREEDY]},
                 {"text": [TEXT, "Hello"], "sampling_params": [GREEDY, {"max_new_tokens": 3}]}):
        resp = http.post("/generate", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "sampling_params"


def test_a_client_gone_mid_stream_aborts_the_request(live, http):
    body = {"text": TEXT, "stream": True,
            "sampling_params": {**GREEDY, "max_new_tokens": 200}}
    with http.stream("POST", "/generate", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                break  # leaving the block closes the connection mid-stream
    assert_engine_clean(live)


def test_sglang_names_for_seed_logit_bias_and_stop_trimming_are_honoured(http):
    """`sampling_seed`, `logit_bias` and `no_stop_trim` change the answer as in SGLang (they
    were ignored)."""
    sampled = {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True}
    a = generate(http, text=TEXT, sampling_params={**sampled, "sampling_seed": 7})
    b = generate(http, text=TEXT, sampling_params={**sampled, "sampling_seed": 7})
    assert a["output_ids"] == b["output_ids"]
    plain = generate(http, text=TEXT, sampling_params=GREEDY)["output_ids"]
    banned = {str(plain[0]): -100.0}
    biased = generate(http, text=TEXT, sampling_params={**GREEDY, "logit_bias": banned})
    assert biased["output_ids"][0] != plain[0]
    text = generate(http, text=TEXT, sampling_params=GREEDY)["text"]
    stop = text[2:5]
    kept = generate(http, text=TEXT, sampling_params={**GREEDY, "stop": stop,
                                                      "no_stop_trim": True})
    trimmed = generate(http, text=TEXT, sampling_params={**GREEDY, "stop": stop})
    assert kept["text"] == trimmed["text"] + stop
