"""Locust users that behave like the gateway's real clients (weights: agent 3, chat 2, batch 1).

- `AgentUser`: runs agent sessions (see conversations.py): one `x-session-affinity` id per
  session, 5-20 turns, each resending the growing conversation, streaming. Each task run is one
  turn, so stopping the test waits for at most one answer.
- `ChatUser`: short streamed multi-turn chats, no affinity header, a human's pause between turns.
- `BatchUser`: one long document per request, not streamed.

Every session (or batch request) acts for a tenant picked by weight from the tenants the test
provisioned (`environment.edgerun`, set up by the locustfile's test_start listener). Answers
are read with `loadtests.workers_ai`, and the metrics of `loadtests.locust_metrics` are fired
from what was read.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any, ClassVar

import requests
from locust import HttpUser, between, task
from locust.exception import StopUser

from loadtests.conversations import Conversation, agent_conversation, batch_prompt, chat_conversation, parse_range
from loadtests.locust_metrics import RunTotals, report_error, report_stream, report_usage
from loadtests.tenants import TenantKey, pick
from loadtests.workers_ai import SSEDecoder, StreamTrace, Usage, WorkersAIError, error_from_body, run_path


class WorkersAIUser(HttpUser):
    """Shared plumbing: tenant choice, one Workers AI call, metric events."""

    abstract = True
    kind: ClassVar[str] = "request"

    def on_start(self) -> None:
        totals: RunTotals | None = getattr(self.environment, "edgerun", None)
        if totals is None or not totals.tenants:
            raise StopUser()  # provisioning failed; the test_start listener said why
        self.totals = totals
        self.rng = random.Random()
        options = self.environment.parsed_options
        self.model: str = options.edgerun_model
        self.max_tokens: int = options.edgerun_max_tokens

    def pick_tenant(self) -> TenantKey:
        return pick(self.rng, self.totals.tenants)

    def call(self, tenant: TenantKey, body: dict[str, Any], *, session_id: str | None = None) -> StreamTrace | None:
        """POST one request; the answer's trace when it succeeded, None when it failed."""
        headers = {"Authorization": f"Bearer {tenant.secret}"}
        if session_id is not None:
            headers["x-session-affinity"] = session_id
        stream = bool(body.get("stream"))
        trace = StreamTrace(sent_at=time.perf_counter())
        with self.client.post(run_path(tenant.account_id, self.model), json=body, headers=headers, stream=stream,
                              catch_response=True, name=self.kind) as response:
            try:
                if response.status_code != 200:
                    content = response.content if response.status_code else str(getattr(response, "error", "")).encode()
                    trace.error = error_from_body(response.status_code, content or b"")
                elif stream:
                    decoder = SSEDecoder()
                    for chunk in response.iter_content(chunk_size=None):
                        now = time.perf_counter()
                        for payload in decoder.feed(chunk):
                            trace.on_payload(payload, now)
                    trace.finish(time.perf_counter())
                else:
                    result = json.loads(response.content)["result"]
                    trace.pieces.append(result["response"])
                    trace.usage = Usage.from_dict(result["usage"])
                    trace.done = True
                    trace.finished_at = time.perf_counter()
            except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
                trace.error = WorkersAIError(0, f"unreadable answer: {exc!r}")
            if trace.e2e_s is not None:
                response.request_meta["response_time"] = trace.e2e_s * 1000
            response.request_meta["response_length"] = len(trace.text)
            if trace.error is not None:
                response.failure(trace.error)
            else:
                response.success()
        if trace.error is not None:
            report_error(self.environment, self.totals, trace.error)
            return None
        if stream:
            report_stream(self.environment, self.kind, trace.ttft_s, trace.itls_s)
        assert trace.usage is not None
        report_usage(self.environment, self.totals, tenant.name, trace.usage)
        return trace


class ConversationUser(WorkersAIUser):
    """One turn per task run; a new conversation (and tenant) when the last one ends or fails."""

    abstract = True
    sends_affinity: ClassVar[bool] = False

    def on_start(self) -> None:
        super().on_start()
        self.conversation: Conversation | None = None
        self.tenant: TenantKey | None = None
        self.session_id: str | None = None
        self.last_reply: str | None = None

    def new_conversation(self, tenant: TenantKey) -> Conversation:
        raise NotImplementedError

    @task
    def turn(self) -> None:
        if self.conversation is None or self.tenant is None or self.conversation.is_done:
            self.tenant = self.pick_tenant()
            self.conversation = self.new_conversation(self.tenant)
            self.session_id = f"{self.kind}-{uuid.uuid4().hex[:12]}" if self.sends_affinity else None
            self.last_reply = None
        messages = self.conversation.next_messages(self.last_reply)
        assert messages is not None
        body = {"messages": messages, "max_tokens": self.max_tokens, "stream": True}
        trace = self.call(self.tenant, body, session_id=self.session_id)
        if trace is None:
            self.conversation = None  # a client gives up on a conversation that failed
        else:
            self.last_reply = trace.text


class AgentUser(ConversationUser):
    weight = 3
    wait_time = between(0.1, 0.5)  # tools answer fast
    kind = "agent"
    sends_affinity = True

    def new_conversation(self, tenant: TenantKey) -> Conversation:
        turns = parse_range(self.environment.parsed_options.edgerun_agent_turns)
        return agent_conversation(self.rng, tenant.name, turns=turns)


class ChatUser(ConversationUser):
    weight = 2
    wait_time = between(1.0, 3.0)  # a person reads and types
    kind = "chat"

    def new_conversation(self, tenant: TenantKey) -> Conversation:
        return chat_conversation(self.rng)


class BatchUser(WorkersAIUser):
    weight = 1
    wait_time = between(1.0, 3.0)
    kind = "batch"

    @task
    def summarize(self) -> None:
        body = {"prompt": batch_prompt(self.rng), "max_tokens": self.max_tokens, "stream": False}
        self.call(self.pick_tenant(), body)
