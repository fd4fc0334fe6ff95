"""Benchmark workloads as lists of sessions, each a script of one or more requests.

- `agent_sessions`: synthetic agent sessions (loadtests/conversations.py): a tenant's shared
  system prompt, tool-call JSON turns, the conversation resent and growing each turn with the
  model's real reply; one `x-session-affinity` id per session.
- `trace_sessions`: the scaled Mooncake trace (mooncake.py): one raw prompt per request, its
  group's session id and tenant, its arrival time.

Requests stream and use temperature 0 (greedy decoding), so every policy sees the same
conversations, up to numerical noise.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loadtests.bench.mooncake import ScaledRequest
from loadtests.conversations import Conversation, agent_conversation
from loadtests.tenants import TenantKey, pick


class Script(Protocol):
    def next_body(self, last_reply: str | None) -> dict[str, Any] | None:
        """The next request body given the previous reply, or None when the session is over."""
        ...


@dataclass(slots=True)
class ConversationScript:
    conversation: Conversation
    max_tokens: int

    def next_body(self, last_reply: str | None) -> dict[str, Any] | None:
        messages = self.conversation.next_messages(last_reply)
        if messages is None:
            return None
        return {"messages": messages, "max_tokens": self.max_tokens, "stream": True, "temperature": 0}


@dataclass(slots=True)
class OneShotScript:
    body: dict[str, Any]
    sent: bool = False

    def next_body(self, last_reply: str | None) -> dict[str, Any] | None:
        if self.sent:
            return None
        self.sent = True
        return self.body


@dataclass(slots=True)
class SessionPlan:
    workload: str
    tenant: TenantKey
    session_id: str | None
    script: Script
    arrival_s: float = 0.0  # trace replay: when the session's (only) request is due
    expected_prompt_tokens: int | None = None  # trace requests: what the prompt must tokenize to


def agent_sessions(keys: Sequence[TenantKey], num_sessions: int, *, seed: int, turns: tuple[int, int],
                   max_tokens: int) -> list[SessionPlan]:
    plans = []
    for i in range(num_sessions):
        rng = random.Random(f"{seed}-agent-{i}")
        tenant = pick(rng, keys)
        conversation = agent_conversation(rng, tenant.name, turns=turns)
        plans.append(SessionPlan("agent", tenant, f"agent-{seed}-{i}", ConversationScript(conversation, max_tokens)))
    return plans


def trace_sessions(keys: Sequence[TenantKey], requests: Sequence[ScaledRequest]) -> list[SessionPlan]:
    plans = []
    for request in requests:
        tenant = pick(random.Random(f"group-{request.group}"), keys)
        body = {"prompt": request.prompt, "raw": True, "max_tokens": request.max_tokens, "stream": True,
                "temperature": 0}
        plans.append(SessionPlan("mooncake", tenant, f"mc-{request.group}", OneShotScript(body), request.arrival_s,
                                 request.num_prompt_tokens))
    return plans
