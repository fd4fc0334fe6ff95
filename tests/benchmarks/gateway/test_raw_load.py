"""benchmarks/gateway/raw_load.py: the distinct request bodies the load generator cycles through."""

from __future__ import annotations

from benchmarks.gateway.raw_load import distinct_bodies


def test_text_prompts_differ_per_request() -> None:
    bodies = distinct_bodies({"prompt": "hello", "stream": True}, count=3)
    assert [b["prompt"] for b in bodies] == ["hello (request 0)", "hello (request 1)", "hello (request 2)"]
    assert all(b["stream"] is True for b in bodies)


def test_the_last_chat_message_differs_and_earlier_ones_are_kept() -> None:
    system = {"role": "system", "content": "be brief"}
    body = {"model": "m", "messages": [system, {"role": "user", "content": "hi"}]}
    bodies = distinct_bodies(body, count=2)
    assert [b["messages"] for b in bodies] == [
        [system, {"role": "user", "content": "hi (request 0)"}],
        [system, {"role": "user", "content": "hi (request 1)"}],
    ]
    assert body["messages"][1]["content"] == "hi"  # the original is untouched


def test_token_prompts_are_sent_as_they_are() -> None:
    body = {"prompt": [1, 2, 3]}
    assert distinct_bodies(body) == [body]
