"""One benchmark request: send it to the gateway, time its stream, keep what was measured."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadtests.bench.workload import SessionPlan
from loadtests.workers_ai import MODEL_ID, SSEDecoder, StreamTrace, WorkersAIError, error_from_body, run_path


@dataclass(slots=True)
class RequestRecord:
    """What one request measured; times in seconds, `start_s` from the start of its load level."""

    workload: str
    tenant: str
    session_id: str | None
    start_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itls_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    expected_prompt_tokens: int | None = None
    error_code: int | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is None

    @property
    def end_s(self) -> float:
        return self.start_s + (self.e2e_s or 0.0)


async def send(http: httpx.AsyncClient, plan: SessionPlan, body: dict[str, Any], *, level_start: float,
               model: str = MODEL_ID) -> tuple[RequestRecord, str]:
    """POST one streamed request as `plan`'s tenant and session; the record and the reply text."""
    headers = {"Authorization": f"Bearer {plan.tenant.secret}"}
    if plan.session_id is not None:
        headers["x-session-affinity"] = plan.session_id
    trace = StreamTrace(sent_at=time.perf_counter())
    record = RequestRecord(plan.workload, plan.tenant.name, plan.session_id, trace.sent_at - level_start,
                           expected_prompt_tokens=plan.expected_prompt_tokens)
    try:
        async with http.stream("POST", run_path(plan.tenant.account_id, model), json=body, headers=headers) as response:
            if response.status_code != 200:
                trace.error = error_from_body(response.status_code, await response.aread())
            else:
                decoder = SSEDecoder()
                async for chunk in response.aiter_raw():
                    now = time.perf_counter()
                    for payload in decoder.feed(chunk):
                        trace.on_payload(payload, now)
        trace.finish(time.perf_counter())
    except httpx.HTTPError as exc:
        trace.error = WorkersAIError(0, f"{type(exc).__name__}: {exc}")
        trace.finish(time.perf_counter())
    except ValueError as exc:  # an undecodable event
        trace.error = WorkersAIError(0, f"unreadable stream: {exc}")
        trace.finish(time.perf_counter())
    record.ttft_s, record.tpot_s, record.e2e_s, record.itls_s = trace.ttft_s, trace.tpot_s, trace.e2e_s, trace.itls_s
    if trace.usage is not None:
        record.prompt_tokens = trace.usage.prompt_tokens
        record.cached_tokens = trace.usage.cached_tokens
        record.completion_tokens = trace.usage.completion_tokens
    if trace.error is not None:
        record.error_code, record.error_message = trace.error.code, trace.error.message
    return record, trace.text
