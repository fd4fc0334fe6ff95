"""A bounded schemathesis run against a live gateway (the stub backend behind it): for every
documented operation, requests generated from /openapi.json, valid and invalid, with the right
credentials. No answer may be a 5xx, every error must be in its route's documented envelope, and
no request the gateway refused (4xx) may leave a ledger record."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from cli.processes import ChildProcess
from gateway.http.openapi import OPERATIONS
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway, gateway_settings
from tests.gateway.stub_backend import MODEL_ID as STUB_MODEL

pytestmark = pytest.mark.slow

MAX_EXAMPLES = int(os.environ.get("EDGERUN_FUZZ_EXAMPLES", "12"))  # per operation: ~20 operations, a few seconds each on 2 shared cores


@pytest.fixture(scope="module")
def fuzzed(stub_backend: ChildProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    backends = [{"id": "stub", "base_url": stub_backend.url, "region": "local", "models": [STUB_MODEL]}]
    models = [{"id": STUB_MODEL, "backend_model": "stub", "block_size": 16}]
    # every request comes from 127.0.0.1: the admin guard would lock it out after 10 wrong tokens
    settings_ = gateway_settings(tmp_path_factory.mktemp("fuzz"), backends, models=models, admin_max_failures=10**6)
    started = InProcessGateway(settings_).start()
    started.secret = started.new_key("t-fuzz", "acc-fuzz")  # type: ignore[attr-defined]
    yield started
    started.stop()


@pytest.fixture(scope="module")
def openapi_schema(fuzzed: InProcessGateway) -> Any:
    return schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")


def credentials(gw: InProcessGateway, path: str, method: str) -> dict[str, str]:
    security = OPERATIONS[(path, method)].get("security") or [{}]
    scheme = next(iter(security[0]), None)
    token = {"apiKey": gw.secret, "adminToken": ADMIN_TOKEN}.get(scheme or "")  # type: ignore[attr-defined]
    return {"authorization": f"Bearer {token}"} if token else {}


def is_envelope(body: Any, *, openai: bool) -> bool:
    if openai:
        error = body.get("error") if isinstance(body, dict) else None
        return isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
    if not isinstance(body, dict) or body.get("success") is not False or body.get("result") is not None:
        return False
    errors = body.get("errors")
    return bool(errors) and all(isinstance(e.get("code"), int) and isinstance(e.get("message"), str) for e in errors)


STATUSES: Counter[tuple[str, str, int]] = Counter()  # what the run saw, for `-s` (RELIABILITY.md)


def check(gw: InProcessGateway, case: Any) -> None:
    path, method = case.operation.path, case.method.lower()
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = STUB_MODEL  # OpenAI bodies name the model: a served one, to reach the backend
    response = case.call(base_url=gw.url, headers=credentials(gw, path, method), timeout=30)
    STATUSES[(path, method, response.status_code)] += 1
    assert response.status_code < 500 or (path == "/healthz" and response.status_code == 503), response.text[:500]
    if response.status_code >= 400:
        assert is_envelope(response.json(), openai="/ai/v1/" in path), response.text[:500]
        request_id = response.headers.get("cf-ray")
        request_id = request_id[0] if isinstance(request_id, list) else request_id  # schemathesis lists values
        if request_id and "/ai/" in path:
            assert gw.store is not None
            assert gw.call(gw.store.ledger.get(request_id)) is None, "a refused request left a ledger record"


@pytest.mark.parametrize(("path", "method"), sorted(OPERATIONS), ids=[f"{m.upper()} {p}" for p, m in sorted(OPERATIONS)])
def test_no_5xx_and_every_error_in_its_envelope(openapi_schema: Any, fuzzed: InProcessGateway, path: str, method: str) -> None:
    operation = openapi_schema[path][method.upper()]
    fixed: dict[str, str] = {}  # the key's own account and a served model: past auth, into the parsers
    names = {p["name"] for p in OPERATIONS[(path, method)].get("parameters", []) if p["in"] == "path"}
    if "account_id" in names:
        fixed["account_id"] = "acc-fuzz"
    if "model" in names:
        fixed["model"] = STUB_MODEL
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE, path_parameters=fixed or None),
        operation.as_strategy(GenerationMode.NEGATIVE, path_parameters=fixed or None),
    )

    @given(cases)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def run(case: Any) -> None:
        check(fuzzed, case)

    run()


def test_report_statuses() -> None:
    """Prints what the run above answered (the figures in RELIABILITY.md); asserts it reached the parsers."""
    for key, count in sorted(STATUSES.items()):
        print(*key, count)
    if STATUSES:
        assert any(status == 400 for _, _, status in STATUSES), "no request reached a parser"
