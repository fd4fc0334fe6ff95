"""End to end: disaggregated prefill/decode through the gateway, on the real model and real backends.

Two backends of this module's own (b1, b2, mixed: they take both steps; the deterministic mode, so
answers can be compared exactly) are listed to one gateway as a prefill backend and a decode
backend, so every request runs the context step on b1, pulls its KV to b2 over TCP and streams
from b2. Answers must equal the collocated ones (another gateway, the same backends as mixed, no
disaggregation), be billed once, and leave no pinned or leaked block behind.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway, gateway_settings, serving, start_backend

pytestmark = pytest.mark.process

PROMPTS = [
    "Hi",  # a few template tokens: one partial block
    "List three colours.",
    "Explain in two sentences why the sky is blue, and what a prism does to white light. " * 4,  # several blocks
]
MAX_TOKENS = 8


def as_role(backend: BackendProcess, role: str, region: str = "local") -> dict[str, Any]:
    return {**backend.spec(), "role": role, "region": region}


@pytest.fixture(scope="module")
def victims() -> Iterator[list[BackendProcess]]:
    """Two real backends to kill: a prefill and a decode one (a tiny random model: quick to start, and
    killed before they serve anything)."""
    started = [
        BackendProcess.spawn(name, "backend", ["--model", "random:tiny", "--role", role, "--log-level", "warning"],
                             env={"EDGERUN_LOG_JSON": "false"}, threads=1, region="near")
        for name, role in (("p-victim", "prefill"), ("d-victim", "decode"))
    ]
    with serving(started) as backends:
        yield backends


@pytest.fixture(scope="module")
def exact_pair() -> Iterator[list[BackendProcess]]:
    """Two real smollm2 backends, b1 and b2, in the engine's deterministic mode: the fast mode's
    int4 path computes a prompt prefilled whole and one prefilled in parts (prefix hits, chunks)
    to within a tolerance, not exactly, so only the exact model can promise equal greedy answers."""
    # (the later --weight-dtype replaces the shared fixture's float16, a fast-mode format)
    exact = ("--mode", "deterministic", "--weight-dtype", "auto")
    with serving([start_backend(name, "local", *exact) for name in ("b1", "b2")]) as backends:
        yield backends


@pytest.fixture(scope="module")
def mixed_gateway(exact_pair: list[BackendProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    settings = gateway_settings(tmp_path_factory.mktemp("mixed"), [as_role(b, "mixed") for b in exact_pair])
    gw = InProcessGateway(settings).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def disagg_gateway(exact_pair: list[BackendProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    b1, b2 = exact_pair
    settings = gateway_settings(tmp_path_factory.mktemp("disagg"), [as_role(b1, "prefill"), as_role(b2, "decode")])
    gw = InProcessGateway(settings).start()
    yield gw
    gw.stop()


_tenants: dict[str, str] = {}  # key -> its tenant (whose account is acc-<tenant>)


def key(gw: InProcessGateway, tenant: str) -> str:
    secret = gw.new_key(tenant, f"acc-{tenant}")
    _tenants[secret] = tenant
    return secret


def run(gw: InProcessGateway, secret: str, prompt: str, max_tokens: int = MAX_TOKENS) -> httpx.Response:
    url = f"{gw.url}/client/v4/accounts/acc-{_tenants[secret]}/ai/run/@cf/huggingface/smollm2-135m-instruct"
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    response = httpx.post(url, json=body, headers={"authorization": f"Bearer {secret}"}, timeout=120)
    assert response.status_code == 200, response.text
    return response


def steps(gw: InProcessGateway) -> dict[tuple[str, str, str], float]:
    counts = {}
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("edgerun_gateway_disagg_steps_total{"):
            labels = dict(part.split("=") for part in line[line.index("{") + 1 : line.index("}")].split(","))
            key = tuple(labels[k].strip('"') for k in ("step", "backend", "outcome"))
            counts[key] = float(line.rsplit(" ", 1)[1])
    return counts


def assert_nothing_pinned_or_leaked(backends: list[BackendProcess]) -> None:
    for backend in backends:
        deadline = time.monotonic() + 15
        while (load := httpx.get(f"{backend.url}/load", timeout=5).json())["running"] or load["kv_blocks_pinned"]:
            assert time.monotonic() < deadline, load
            time.sleep(0.05)
        assert load["kv_pins_exported"] == 0
        assert load["kv_blocks_free"] == load["kv_blocks_total"], load  # cached blocks count as free


@pytest.fixture(scope="module")
def collocated(mixed_gateway: InProcessGateway) -> dict[str, str]:
    """The answers without disaggregation (b1 and b2 as mixed backends behind another gateway)."""
    secret = key(mixed_gateway, "t-colo")
    return {prompt: run(mixed_gateway, secret, prompt).json()["result"]["response"] for prompt in PROMPTS}


def test_disaggregated_answers_equal_collocated_ones_and_are_billed_once(
    disagg_gateway: InProcessGateway, collocated: dict[str, str], exact_pair: list[BackendProcess]
) -> None:
    gw = disagg_gateway
    secret = key(gw, "t-disagg")
    before = steps(gw)
    for attempt in ("cold", "warm"):  # warm: both sides hold the prompt's full blocks in their prefix caches
        for prompt in PROMPTS:
            response = run(gw, secret, prompt)
            result = response.json()["result"]
            assert result["response"] == collocated[prompt], (attempt, prompt)
            usage = result["usage"]
            assert gw.store is not None
            record = gw.ledger_record(response.headers["cf-ray"])
            assert record.backend_id == "b2" and record.status == "ok"
            assert (record.prompt_tokens, record.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
            assert record.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]
            assert usage["completion_tokens"] <= MAX_TOKENS
            if attempt == "warm" and usage["prompt_tokens"] >= 32:
                assert usage["prompt_tokens_details"]["cached_tokens"] >= 16  # the context step's prefix hits
    after = steps(gw)
    ran = {step: after.get((step, b, "ok"), 0) - before.get((step, b, "ok"), 0) for step, b in (("context", "b1"), ("generation", "b2"))}
    assert ran == {"context": 2 * len(PROMPTS), "generation": 2 * len(PROMPTS)}
    assert_nothing_pinned_or_leaked(exact_pair)


def test_sixteen_concurrent_requests_are_correct_and_leave_nothing_pinned(
    disagg_gateway: InProcessGateway, collocated: dict[str, str], exact_pair: list[BackendProcess]
) -> None:
    secret = key(disagg_gateway, "t-many")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda p: run(disagg_gateway, secret, p).json()["result"]["response"], prompts))
    assert answers == [collocated[p] for p in prompts]
    assert_nothing_pinned_or_leaked(exact_pair)


def test_a_one_token_answer_comes_from_the_context_step_alone(
    disagg_gateway: InProcessGateway, exact_pair: list[BackendProcess]
) -> None:
    secret = key(disagg_gateway, "t-one")
    before = steps(disagg_gateway)
    usage = run(disagg_gateway, secret, PROMPTS[1], max_tokens=1).json()["result"]["usage"]
    assert usage["completion_tokens"] == 1
    after = steps(disagg_gateway)
    assert after.get(("generation", "b2", "ok"), 0) == before.get(("generation", "b2", "ok"), 0)
    assert after[("context", "b1", "ok")] == before.get(("context", "b1", "ok"), 0) + 1
    assert_nothing_pinned_or_leaked(exact_pair)


def test_killed_prefill_and_decode_backends_are_failed_over_before_the_first_byte(
    exact_pair: list[BackendProcess], victims: list[BackendProcess], collocated: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The victims are in the gateway's own region, so they are tried first; health checks are slow on
    purpose, so only the failing steps can reveal their death. The decode backend is gone when the
    generation step starts: the next one pulls the same pinned KV. The prefill backend is gone: the
    next one runs the context step."""
    b1, b2 = exact_pair
    p_victim, d_victim = victims
    specs = [as_role(b1, "prefill", "far"), as_role(b2, "decode", "far"),
             as_role(p_victim, "prefill", "near"), as_role(d_victim, "decode", "near")]
    settings = gateway_settings(
        tmp_path_factory.mktemp("disagg-failover"), specs, region="near", region_fallbacks=["far"], health_interval_s=3600
    )
    gw = InProcessGateway(settings).start()
    try:
        time.sleep(0.3)  # the first health round: all four answer
        for victim in victims:
            victim.kill()
        response = run(gw, key(gw, "t-fail"), PROMPTS[2])
        assert response.json()["result"]["response"] == collocated[PROMPTS[2]]
        counts = steps(gw)
        assert counts[("context", "p-victim", "error")] == 1 and counts[("context", "b1", "ok")] == 1
        assert counts[("generation", "b2", "ok")] == 1
        assert gw.ledger_record(response.headers["cf-ray"]).backend_id == "b2"
        assert 'edgerun_gateway_failovers_total{backend="b2"} 1.0' in httpx.get(f"{gw.url}/metrics", timeout=10).text
    finally:
        gw.stop()
    assert_nothing_pinned_or_leaked(exact_pair)


def test_pulling_a_pin_twice_is_a_clear_error(exact_pair: list[BackendProcess]) -> None:
    b1, b2 = exact_pair
    body = {"prompt": list(range(1000, 1040)), "max_tokens": 4, "temperature": 0.0}
    context_only = {**body, "disaggregated_params": {"request_type": "context_only"}}
    context = httpx.post(f"{b1.url}/v1/completions", json=context_only, timeout=60).json()
    choice = context["choices"][0]
    assert choice["finish_reason"] == "not_finished" and context["prompt_token_ids"] == body["prompt"]
    params = {**choice["disaggregated_params"], "request_type": "generation_only"}
    assert params["first_gen_tokens"] and params["ctx_request_id"] and params["encoded_opaque_state"]
    generation = {**body, "disaggregated_params": params}
    first = httpx.post(f"{b2.url}/v1/completions", json=generation, timeout=60)
    assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] == 4
    again = httpx.post(f"{b2.url}/v1/completions", json=generation, timeout=60)
    assert again.status_code == 410
    assert "run the context step again" in again.json()["error"]["message"]
    assert_nothing_pinned_or_leaked(exact_pair)


