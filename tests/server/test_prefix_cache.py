"""The prefix cache over HTTP, through the official `openai` client where it has the field:
usage.prompt_tokens_details.cached_tokens (completions and chat, whole and streamed), the
Prometheus counters, POST /reset_prefix_cache (refused while requests hold blocks, behind
the API key), and the bench HTTP backend reading the cached tokens."""

from __future__ import annotations

import json
import random
import time

import httpx
import openai
import pytest

from kvtier.bench.http_backend import HTTPBackend
from kvtier.bench.request import BenchRequest
from kvtier.cli import build_parser
from kvtier.server.app import build_app
from kvtier.server.metrics import stats_from_metrics
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server

BLOCK = 16  # ENGINE_OPTIONS' block size
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def live(tiny_model_dir):
    """Its own engine: these tests reset its cache and count its hits."""
    srv = start_server(build_app(make_engine(tiny_model_dir)))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(live):
    with openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _ids(seed: int, n: int) -> list[int]:
    """A prompt no other test shares (the cache outlives each test)."""
    rng = random.Random(seed)
    return [rng.randrange(100, 2000) for _ in range(n)]


def _cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


def _complete(client, prompt, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=kw.pop("max_tokens", 3),
                                     temperature=0, extra_body=NO_EOS, **kw)


def test_completion_usage_reports_cached_tokens(live, client):
    doc = _ids(1, 3 * BLOCK + 5)
    first = _complete(client, doc)
    again = _complete(client, doc + [7, 8])
    assert _cached(first.usage) == 0
    assert _cached(again.usage) == 3 * BLOCK and again.usage.prompt_tokens == len(doc) + 2
    assert live.call(lambda e: e.kv_manager.prefix_cache.num_cached_blocks) > 0
    assert_engine_clean(live)


def test_several_prompts_sum_their_cached_tokens(client):
    a, b = _ids(2, 2 * BLOCK + 1), _ids(3, BLOCK + 3)
    _complete(client, [a, b])
    out = _complete(client, [a + [1], b + [2], _ids(4, 20)])
    assert _cached(out.usage) == 2 * BLOCK + BLOCK


def test_streamed_completion_usage(client):
    doc = _ids(5, 2 * BLOCK + 2)
    _complete(client, doc)
    chunks = list(_complete(client, doc, max_tokens=6, stream=True,
                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and _cached(chunks[-1].usage) == 2 * BLOCK
    assert all(c.usage is None for c in chunks[:-1])
    continuous = list(_complete(client, doc, max_tokens=4, stream=True, stream_options={
        "include_usage": True, "continuous_usage_stats": True}))
    assert all(_cached(c.usage) == 2 * BLOCK for c in continuous)


def test_chat_usage_whole_and_streamed(live, client):
    system = " ".join(f"rule{i}" for i in range(60))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    prompt_len = len(live.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    kw = dict(model=MODEL, messages=messages, max_tokens=3, temperature=0, extra_body=NO_EOS)
    first = client.chat.completions.create(**kw)
    again = client.chat.completions.create(**kw)
    assert _cached(first.usage) == 0 and first.usage.prompt_tokens == prompt_len
    assert _cached(again.usage) == (prompt_len - 1) // BLOCK * BLOCK > 0
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **kw))
    assert _cached(chunks[-1].usage) == _cached(again.usage)


def _scrape(live) -> dict[str, float]:
    text = httpx.get(live.base_url + "/metrics").text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("kvtier:prefix_cache") or line.startswith("kvtier:kv_blocks_cached")}


def test_prometheus_counters_follow_the_usage(live, client):
    doc = _ids(6, 4 * BLOCK + 1)
    before = _scrape(live)
    _complete(client, doc)
    hit = _complete(client, doc)
    assert_engine_clean(live)
    after = _scrape(live)
    grew = {k: after[k] - before[k] for k in before}
    assert grew["kvtier:prefix_cache_queries_total"] == 2 * len(doc)
    assert grew["kvtier:prefix_cache_hits_total"] == _cached(hit.usage) == 4 * BLOCK
    assert after["kvtier:prefix_cache_hit_rate"] == pytest.approx(
        after["kvtier:prefix_cache_hits_total"] / after["kvtier:prefix_cache_queries_total"])
    assert after["kvtier:kv_blocks_cached"] > 0
    stats = live.call(lambda e: e.get_stats())
    assert stats_from_metrics(httpx.get(live.base_url + "/metrics").text) == stats
    assert stats.gpu_blocks_used == 0  # cached blocks nobody holds count as free


def test_reset_prefix_cache_when_idle(live, client):
    doc = _ids(7, 2 * BLOCK + 1)
    _complete(client, doc)
    assert_engine_clean(live)
    resp = httpx.post(live.base_url + "/reset_prefix_cache")
    assert resp.status_code == 200 and resp.json() == {"reset": True}
    assert live.call(lambda e: e.kv_manager.prefix_cache.num_cached_blocks) == 0
    assert live.call(lambda e: e.kv_manager.gpu.num_used) == 0
    assert _cached(_complete(client, doc).usage) == 0  # computed again


def test_reset_prefix_cache_while_a_request_runs_is_refused(live, client):
    doc = _ids(8, 2 * BLOCK + 1)
    _complete(client, doc)
    stream = _complete(client, doc + [9], max_tokens=200, stream=True)
    next(iter(stream))  # running now: it holds its blocks (and the cached ones it hit)
    cached = live.call(lambda e: dict(e.kv_manager.prefix_cache.index))
    resp = httpx.post(live.base_url + "/reset_prefix_cache")
    assert resp.status_code == 409
    error = resp.json()["error"]
    assert error["code"] == "prefix_cache_busy" and "hold KV blocks" in error["message"]
    # Nothing dropped (the running request may have cached more blocks since).
    assert cached.items() <= live.call(lambda e: dict(e.kv_manager.prefix_cache.index)).items()
    live.call(lambda e: e.check_integrity())
    stream.close()  # the client leaves: the request is aborted, its blocks released
    assert_engine_clean(live)
    assert httpx.post(live.base_url + "/reset_prefix_cache").status_code == 200


@pytest.mark.parametrize("method", ["get", "post"])
def test_sglangs_flush_cache_is_the_same_reset(live, client, method):
    doc = _ids(10, 2 * BLOCK + 1)
    _complete(client, doc)
    assert_engine_clean(live)
    resp = getattr(httpx, method)(live.base_url + "/flush_cache")
    assert resp.status_code == 200 and resp.json() == {"reset": True}
    assert live.call(lambda e: e.kv_manager.prefix_cache.num_cached_blocks) == 0


def test_reset_prefix_cache_needs_the_api_key(tiny_model_dir):
    srv = start_server(build_app(make_engine(tiny_model_dir), api_key="sesame"))
    try:
        url = srv.base_url + "/reset_prefix_cache"
        assert httpx.post(url).status_code == 401
        assert httpx.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = httpx.post(url, headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200 and ok.json() == {"reset": True}
        assert httpx.post(srv.base_url + "/flush_cache").status_code == 401
        assert httpx.get(srv.base_url + "/metrics").status_code == 200  # still open
    finally:
        srv.stop()


def test_http_backend_reads_cached_tokens(live):
    doc = tuple(_ids(9, 3 * BLOCK + 2))
    backend = HTTPBackend(live.base_url, model=MODEL)
    records = {}
    try:
        for rid, prompt in (("cold", doc), ("warm", doc + (5,))):
            backend.submit(rid, BenchRequest(prompt, output_len=3), time.monotonic())
            deadline = time.monotonic() + 30
            while rid not in records and time.monotonic() < deadline:
                records.update({r.request_id: r for r in backend.poll(0.05)})
    finally:
        backend.close()
    assert records["cold"].ok and records["warm"].ok
    assert (records["cold"].num_cached_tokens, records["warm"].num_cached_tokens) == (0, 3 * BLOCK)
    assert_engine_clean(live)


@pytest.mark.parametrize("command", [["serve", "m"], ["generate", "m", "p"]])
def test_help_shows_the_prefix_caching_flags(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command[0], "--help"])
    text = capsys.readouterr().out
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching",
                 "--prefix-caching-hash-algo"):
        assert flag in text
    args = build_parser().parse_args([*command, "--no-enable-prefix-caching"])
    assert args.enable_prefix_caching is False
    assert build_parser().parse_args(command).enable_prefix_caching is None  # the engine decides


def test_openapi_lists_the_reset_endpoint(live):
    spec = json.loads(httpx.get(live.base_url + "/openapi.json").text)
    assert "post" in spec["paths"]["/reset_prefix_cache"]


def test_cache_salt_keeps_tenants_apart(client):
    """vLLM's cache_salt: the same prompt hits only under the same salt (completions and
    chat, as vLLM's request field); an empty salt is a 400 naming it."""
    doc = _ids(11, 3 * BLOCK + 2)

    def complete(salt):
        return client.completions.create(model=MODEL, prompt=doc, max_tokens=2, temperature=0,
                                         extra_body={"cache_salt": salt} if salt is not None else None)

    complete("tenant-a")
    same, other, unsalted = complete("tenant-a"), complete("tenant-b"), complete(None)
    assert _cached(same.usage) == 3 * BLOCK
    assert _cached(other.usage) == 0 and _cached(unsalted.usage) == 0
    messages = [{"role": "user", "content": "salted " * 40}]
    for salt, hits in (("x", False), ("x", True), ("y", False)):
        out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                             extra_body={"cache_salt": salt})
        assert (_cached(out.usage) > 0) is hits, salt
    with pytest.raises(openai.BadRequestError, match="cache_salt"):
        complete("")


def test_responses_pass_the_cache_salt_on(live):
    body = {"model": MODEL, "input": "salted " * 40, "max_output_tokens": 2}
    with httpx.Client(base_url=live.base_url, timeout=60) as http:
        assert http.post("/v1/responses", json={**body, "cache_salt": "r"}).status_code == 200
        again = http.post("/v1/responses", json={**body, "cache_salt": "r"}).json()
        assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0
        other = http.post("/v1/responses", json={**body, "cache_salt": "s"}).json()
        assert other["usage"]["input_tokens_details"]["cached_tokens"] == 0
        bad = http.post("/v1/responses", json={**body, "cache_salt": ""})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"
