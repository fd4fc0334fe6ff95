"""What simulated clients say: agent sessions, short chats and long batch prompts.

All text is drawn from seeded generators, so a seed reproduces a workload exactly (up to what
the model answers).

- Agent: a session of 5-20 turns. Every tenant's agents share one long system prompt (the
  tenant's tools and house rules, the prefix a cache-aware router should keep warm), the first
  user message states a task, and after each model reply the agent appends that reply and a
  tool result as JSON (`{"tool": ..., "result": {...}}`), or now and then a user follow-up. Each
  turn resends the whole, growing conversation, as agent frameworks do.
- Chat: 2-4 short user questions under a generic system prompt, each resending the conversation.
- Batch: one long document to summarise in a single request.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from loadtests.words import WORDS, sentences, words


def _tool(name: str, description: str, **parameters: str) -> dict[str, Any]:
    return {"name": name, "description": description, "parameters": parameters}


TOOLS: tuple[dict[str, Any], ...] = (
    _tool("lookup_order", "Find an order by id", order_id="integer"),
    _tool("refund_order", "Refund part or all of an order", order_id="integer", amount="number"),
    _tool("search_docs", "Search the knowledge base", query="string", limit="integer"),
    _tool("get_weather", "Weather at a city", city="string"),
    _tool("create_ticket", "Open a support ticket", title="string", priority="string"),
    _tool("list_invoices", "Invoices of a customer", customer_id="integer", month="string"),
    _tool("send_email", "Email a customer", to="string", subject="string", body="string"),
    _tool("run_sql", "Read-only SQL on the reporting database", query="string"),
)


def system_prompt(tenant: str, *, num_rule_words: int = 60) -> str:
    """The tenant's agent system prompt: the same text for every session of that tenant."""
    rng = random.Random(f"system-{tenant}")
    tools = rng.sample(TOOLS, 5)
    lines = [
        f"You are the operations agent of {tenant}. Reply in one short sentence, or call one tool by "
        'replying with JSON: {"tool": "<name>", "arguments": {...}}.',
        "Tools:",
        *(json.dumps(tool, separators=(", ", ": ")) for tool in tools),
        "House rules: " + sentences(rng, num_rule_words),
    ]
    return "\n".join(lines)


def tool_result(rng: random.Random) -> str:
    """A tool call's result as the agent would append it: one JSON object."""
    tool = rng.choice(TOOLS)["name"]
    result: dict[str, Any] = {
        "id": rng.randint(1000, 99999),
        "status": rng.choice(["ok", "shipped", "pending", "refunded", "open"]),
        "items": [{"sku": f"{rng.choice(WORDS)}-{rng.randint(1, 99)}", "qty": rng.randint(1, 5)}
                  for _ in range(rng.randint(1, 3))],
        "note": words(rng, rng.randint(4, 12)),
    }
    return json.dumps({"tool": tool, "result": result})


@dataclass(slots=True)
class Conversation:
    """A multi-turn conversation that grows with the model's real replies.

    `next_messages(last_reply)` returns the messages to send for the next turn (a copy), or
    None once the conversation is over. `last_reply` is the text the model answered the turn
    before (ignored on the first turn).
    """

    rng: random.Random
    num_turns: int
    messages: list[dict[str, str]]
    agent: bool  # agents append tool results; chats append user questions
    turn: int = 0

    def next_messages(self, last_reply: str | None) -> list[dict[str, str]] | None:
        if self.turn >= self.num_turns:
            return None
        if self.turn > 0:
            self.messages.append({"role": "assistant", "content": last_reply or ""})
            self.messages.append(self._follow_up())
        self.turn += 1
        return [dict(m) for m in self.messages]

    def _follow_up(self) -> dict[str, str]:
        if self.agent and self.rng.random() < 0.75:
            return {"role": "tool", "content": tool_result(self.rng)}
        return {"role": "user", "content": f"{self.rng.choice(FOLLOW_UPS)} {words(self.rng, self.rng.randint(2, 6))}?"}

    @property
    def is_done(self) -> bool:
        return self.turn >= self.num_turns


TASKS = (
    "Customer {n} says order {m} never arrived; check it and fix it.",
    "Prepare a refund summary for customer {n} covering order {m}.",
    "Find why invoice {m} for customer {n} was charged twice.",
    "Draft an email to customer {n} about the delay of order {m}.",
)
QUESTIONS = (
    "What is a good name for a",
    "Explain in one sentence why the",
    "Give me a short tip about the",
    "How do I start learning about the",
    "Write a haiku about the",
)
FOLLOW_UPS = ("And what about the", "Can you say more about the", "Why is that true for the", "Is it the same for the")


def parse_range(text: str) -> tuple[int, int]:
    """`"5-20"` -> (5, 20); `"8"` -> (8, 8)."""
    low, _, high = text.partition("-")
    lo, hi = int(low), int(high or low)
    if not 1 <= lo <= hi:
        raise ValueError(f"{text!r}: give N or MIN-MAX with 1 <= MIN <= MAX")
    return lo, hi


def agent_conversation(rng: random.Random, tenant: str, *, turns: tuple[int, int] = (5, 20)) -> Conversation:
    task = rng.choice(TASKS).format(n=rng.randint(100, 999), m=rng.randint(10000, 99999))
    messages = [{"role": "system", "content": system_prompt(tenant)}, {"role": "user", "content": task}]
    return Conversation(rng, rng.randint(*turns), messages, agent=True)


def chat_conversation(rng: random.Random, *, turns: tuple[int, int] = (2, 4)) -> Conversation:
    question = f"{rng.choice(QUESTIONS)} {words(rng, rng.randint(1, 3))}?"
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
                {"role": "user", "content": question}]
    return Conversation(rng, rng.randint(*turns), messages, agent=False)


def batch_prompt(rng: random.Random, *, num_words: tuple[int, int] = (150, 300)) -> str:
    """One long document to summarise (sent as `prompt`, answered without streaming)."""
    return "Summarize the following report in one sentence.\n\n" + sentences(rng, rng.randint(*num_words))
