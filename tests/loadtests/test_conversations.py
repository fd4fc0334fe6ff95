from __future__ import annotations

import json
import random

import pytest

from loadtests.conversations import agent_conversation, batch_prompt, chat_conversation, parse_range, system_prompt


def test_tenants_share_a_system_prompt_and_differ_from_each_other() -> None:
    assert system_prompt("acme") == system_prompt("acme") != system_prompt("globex")
    first = agent_conversation(random.Random(1), "acme").next_messages(None)
    other = agent_conversation(random.Random(2), "acme").next_messages(None)
    assert first is not None and other is not None
    assert first[0] == other[0] == {"role": "system", "content": system_prompt("acme")}


def test_an_agent_session_grows_with_replies_and_tool_results() -> None:
    conversation = agent_conversation(random.Random(5), "acme", turns=(6, 6))
    sent = []
    reply = None
    while (messages := conversation.next_messages(reply)) is not None:
        sent.append(messages)
        reply = f"reply {len(sent)}"
    assert len(sent) == 6
    for before, after in zip(sent, sent[1:]):
        assert after[: len(before)] == before  # each turn resends the conversation so far
        assert after[len(before)] == {"role": "assistant", "content": f"reply {len(sent[: sent.index(after)])}"}
    tool_turns = [m for m in sent[-1] if m["role"] == "tool"]
    assert tool_turns and all("result" in json.loads(m["content"]) for m in tool_turns)


def test_chat_and_batch() -> None:
    chat = chat_conversation(random.Random(3))
    assert 2 <= chat.num_turns <= 4
    assert len(batch_prompt(random.Random(3)).split()) > 150


def test_parse_range() -> None:
    assert parse_range("5-20") == (5, 20)
    assert parse_range("3") == (3, 3)
    for bad in ("0-2", "5-2", "x"):
        with pytest.raises(ValueError):
            parse_range(bad)
