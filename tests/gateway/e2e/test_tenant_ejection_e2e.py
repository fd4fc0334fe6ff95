"""One tenant cannot take a model offline for the others, through real processes.

- The schema bomb: an integer past 64 bits anywhere in a JSON schema made the built-in backend
  answer 500 (llguidance raised), and three such requests at once ejected every backend, leaving
  another tenant ~4% availability. Now the gateway refuses it at every entry (400 naming the path)
  and the backend itself answers 400. Repeated three at once, round after round, the other tenant
  keeps every request and no backend is ejected (the session's two real SmolLM2 backends).
- A backend that fails one tenant's requests with 5xx answers (the stub backend with
  `--fail-guided`: every guided request is a 500) is not ejected however often that tenant sends
  them; failed answers of three tenants in a row do eject it (policies/breaker.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from cli.processes import ChildProcess
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway import stub_backend
from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway, gateway_settings, running_child

pytestmark = pytest.mark.slow

ROUNDS = 4
BOMB = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 2**64}}}
ASK = [{"role": "user", "content": "Give me a number."}]
WORKERS_AI, OPENAI = "/ai/run/{model}", "/ai/v1/chat/completions"
BOMBS: list[tuple[str, dict[str, Any], str]] = [  # (route, body, the path the 400 names)
    (WORKERS_AI, {"messages": ASK, "guided_json": BOMB}, "guided_json"),
    (WORKERS_AI, {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": BOMB}},
     "response_format.json_schema"),
    (OPENAI, {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": BOMB}}},
     "response_format.json_schema.schema"),
    ("/ai/v1/responses", {"input": "a number", "text": {"format": {"type": "json_schema", "name": "n", "schema": BOMB}}},
     "text.format.schema"),
    (WORKERS_AI, {"messages": ASK, "tools": [{"name": "pick", "parameters": BOMB}], "tool_choice": "required"},
     "tools[0].parameters"),
]


class Tenant:
    def __init__(self, gw: InProcessGateway, tenant: str, model: str) -> None:
        self.account = f"acc-{tenant}"
        self.base = f"{gw.url}/client/v4/accounts/{self.account}"
        self.headers = {"authorization": f"Bearer {gw.new_key(tenant, self.account)}"}
        self.model = model

    def post(self, route: str, body: dict[str, Any]) -> httpx.Response:
        if route != WORKERS_AI:
            body = {"model": self.model, **body}
        limit = "max_output_tokens" if route.endswith("/responses") else "max_tokens"
        url = self.base + route.format(model=self.model)
        return httpx.post(url, json={limit: 2, **body}, headers=self.headers, timeout=60)


def breakers(gw: InProcessGateway, backends: list[str]) -> list[tuple[float | None, float | None]]:
    """(state: 0 closed, 2 open; ejections so far) of each backend, from the gateway's metrics."""
    registry = gw.services.metrics.registry
    return [
        (registry.get_sample_value("edgerun_gateway_backend_breaker_state", {"backend": b}),
         registry.get_sample_value("edgerun_gateway_backend_ejections_total", {"backend": b}))
        for b in backends
    ]


def bombard(bomber: Tenant, victim: Tenant, bombs: list[tuple[str, dict[str, Any], str]]) -> list[httpx.Response]:
    """ROUNDS rounds of three bombs at once (each checked), each round followed by two of the
    victim's requests; returns the victim's answers."""
    answers: list[httpx.Response] = []
    with ThreadPoolExecutor(3) as pool:
        for round_ in range(ROUNDS):
            three = [bombs[(3 * round_ + i) % len(bombs)] for i in range(3)]
            for (route, _, path), answer in zip(three, pool.map(lambda b: bomber.post(b[0], b[1]), three), strict=True):
                check_refused(route, path, answer)
            answers += [victim.post(WORKERS_AI, {"prompt": "Hello"}) for _ in range(2)]
    return answers


def check_refused(route: str, path: str, answer: httpx.Response) -> None:
    """A bomb's answer: refused by the gateway as the request's fault, naming where the integer is."""
    assert answer.status_code == 400, (route, answer.text)
    assert f"{path}.properties.n.maximum is 18446744073709551616" in answer.text, answer.text


def test_the_schema_bomb_is_a_400_naming_its_path_and_leaves_other_tenants_served(
    gateway: InProcessGateway, backend_pair: list[BackendProcess]
) -> None:
    before = breakers(gateway, ["b1", "b2"])
    bomber = Tenant(gateway, "t-bomber", DEFAULT_MODEL_ID)
    victim = Tenant(gateway, "t-victim", DEFAULT_MODEL_ID)
    answers = bombard(bomber, victim, BOMBS)
    assert [a.status_code for a in answers] == [200] * 2 * ROUNDS, [a.text for a in answers if a.status_code != 200]
    assert breakers(gateway, ["b1", "b2"]) == before and before[0][0] == 0 and before[1][0] == 0
    # the backend itself, reached directly: the grammar library's failure is the request's fault
    direct = httpx.post(f"{backend_pair[0].url}/v1/completions", timeout=60, json={
        "prompt": "x", "max_tokens": 2, "response_format": {"type": "json_schema", "json_schema": BOMB}})
    assert direct.status_code == 400 and "schema.properties.n.maximum" in direct.text, direct.text


@pytest.fixture(scope="module")
def failing_stub() -> Iterator[ChildProcess]:
    with running_child("failing stub", lambda port: stub_backend.command(port, num_chunks=4, fail_guided=True)) as child:
        yield child


@pytest.fixture(scope="module")
def stub_gateway(failing_stub: ChildProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    backends = [{"id": "stub", "base_url": failing_stub.url, "region": "local", "models": [stub_backend.MODEL_ID]}]
    settings = gateway_settings(
        tmp_path_factory.mktemp("tenant-ejection"), backends,
        models=[{"id": stub_backend.MODEL_ID, "backend_model": "stub", "block_size": 16}],
        health_interval_s=3600.0, breaker_failure_threshold=3,
    )
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


def test_one_tenants_failed_answers_never_eject_a_backend_but_three_tenants_do(stub_gateway: InProcessGateway) -> None:
    gw, model = stub_gateway, stub_backend.MODEL_ID
    bomber, victim = Tenant(gw, "t-5xx", model), Tenant(gw, "t-plain", model)
    guided = {"prompt": "x", "response_format": {"type": "json_object"}}  # the stub answers it 500
    failed: list[int] = []
    with ThreadPoolExecutor(3) as pool:
        for _ in range(ROUNDS):
            failed += [a.status_code for a in pool.map(lambda _: bomber.post(WORKERS_AI, guided), range(3))]
            answers = [victim.post(WORKERS_AI, {"prompt": "Hello"}) for _ in range(2)]
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert len(failed) == 3 * ROUNDS and 200 not in failed  # each of them failed on the backend
    assert breakers(gw, ["stub"]) == [(0.0, 0.0)]
    # The backend failing everyone's guided requests in a row is its own fault: three tenants eject it.
    assert bomber.post(WORKERS_AI, guided).status_code != 200
    assert victim.post(WORKERS_AI, guided).status_code != 200
    assert breakers(gw, ["stub"]) == [(0.0, 0.0)]  # two tenants: not yet
    assert Tenant(gw, "t-third", model).post(WORKERS_AI, guided).status_code != 200
    assert breakers(gw, ["stub"]) == [(2.0, 1.0)]
