"""Clients for the end-to-end billing tests: what each request saw, to compare with the ledger."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Seen:
    """One request as its client saw it."""

    kind: str  # "stream", "whole", "openai" or "leave" (a stream the client abandons)
    max_tokens: int
    metadata: dict[str, Any]
    request_id: str | None = None  # the cf-ray header: the ledger's key
    status_code: int = 0
    num_chunks: int = 0  # text chunks received
    usage: tuple[int, int, int] | None = None  # (prompt, completion, cached) as reported to the client
    broken: bool = False  # the stream ended with an error event
    left: bool = False  # the client went away mid-stream
    error: str | None = None  # the body of a non-200 answer


def _usage(usage: dict[str, Any]) -> tuple[int, int, int]:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return usage["prompt_tokens"], usage["completion_tokens"], cached


async def run_request(http: httpx.AsyncClient, base: str, account: str, model: str, secret: str, seen: Seen,
                      prompt: str, leave_after: int = 2, session: str | None = None) -> Seen:
    headers = {"authorization": f"Bearer {secret}", "cf-aig-metadata": json.dumps(seen.metadata)}
    if session:
        headers["x-session-affinity"] = session
    if seen.kind == "openai":
        url = f"{base}/client/v4/accounts/{account}/ai/v1/chat/completions"
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}],
                                "max_tokens": seen.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
    else:
        url = f"{base}/client/v4/accounts/{account}/ai/run/{model}"
        body = {"prompt": prompt, "max_tokens": seen.max_tokens, "stream": seen.kind != "whole"}
    if seen.kind == "whole":
        response = await http.post(url, json=body, headers=headers)
        seen.request_id, seen.status_code = response.headers.get("cf-ray"), response.status_code
        if response.status_code == 200:
            seen.usage = _usage(response.json()["result"]["usage"])
            seen.num_chunks = 1
        else:
            seen.error = response.text
        return seen
    async with http.stream("POST", url, json=body, headers=headers) as response:
        seen.request_id, seen.status_code = response.headers.get("cf-ray"), response.status_code
        if response.status_code != 200:
            seen.error = (await response.aread()).decode(errors="replace")
            return seen
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "errors" in event or "error" in event:
                seen.broken = True
            elif event.get("usage"):
                seen.usage = _usage(event["usage"])
            elif event.get("response") or (event.get("choices") and event["choices"][0]["delta"].get("content")):
                seen.num_chunks += 1
                if seen.kind == "leave" and seen.num_chunks >= leave_after:
                    seen.left = True
                    break  # leaving the block closes the connection mid-stream
    return seen
