"""Schemathesis against the server's own OpenAPI schema: no 5xx, no crash, engine intact.

Bounded: MAX_EXAMPLES generated cases per operation and mode (valid and invalid data), on an
engine whose short context (max_model_len 64) keeps every accepted request cheap.
(Schemathesis' pytest plugin does not run on pytest 9, so hypothesis drives its strategies.)
"""

from __future__ import annotations

import os
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server

# Deterministic in CI; KVTIER_FUZZ_EXAMPLES=2000 KVTIER_FUZZ_RANDOM=1 for a deeper hunt.
MAX_EXAMPLES = int(os.environ.get("KVTIER_FUZZ_EXAMPLES", "100"))
DERANDOMIZE = not os.environ.get("KVTIER_FUZZ_RANDOM")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_dir):
    srv = start_server(build_app(make_engine(tiny_model_dir, max_model_len=64, max_num_seqs=16)))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.base_url + "/openapi.json")


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def _fuzz(operation, mode: GenerationMode, base_url: str, statuses: Counter) -> None:
    checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

    @given(case=operation.as_strategy(generation_mode=mode), use_model=st.booleans())
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
              suppress_health_check=list(HealthCheck))
    def run(case, use_model: bool) -> None:
        # Random model names all end in 404; name the served one in about half the valid
        # cases so the fuzzer reaches tokenization, validation and the engine. (Not in
        # invalid ones: a wrong model may be the only thing that makes them invalid.)
        if use_model and mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
            case.body["model"] = MODEL
        response = case.call(base_url=base_url, timeout=30)
        statuses[(operation.path, response.status_code)] += 1
        case.validate_response(response, checks=checks)

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(api_schema, fuzz_server, mode):
    operations = _operations(api_schema)
    paths = {op.path for op in operations}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"} <= paths
    statuses: Counter = Counter()
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            continue  # nothing to get wrong in a request without parameters
        _fuzz(operation, mode, fuzz_server.base_url, statuses)
    print(sorted(statuses.items()))
    # The fuzzer got past validation into the engine, and was refused elsewhere.
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert statuses[(path, 400)] > 0
        if mode is GenerationMode.POSITIVE:
            assert statuses[(path, 200)] > 0


def test_engine_intact_after_fuzzing(fuzz_server):
    assert httpx.get(fuzz_server.base_url + "/health").status_code == 200
    resp = httpx.post(fuzz_server.base_url + "/v1/completions",
                      json={"model": MODEL, "prompt": "still alive", "max_tokens": 2})
    assert resp.status_code == 200
    assert_engine_clean(fuzz_server)
