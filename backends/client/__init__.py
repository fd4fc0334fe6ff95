"""The client every gateway component uses to reach a backend (see `client.BackendClient`).

Public API: `Endpoint`, `BackendClient`, `CompletionChunk`, `Usage`, and the error tree in
`errors` (`BackendError` and its subclasses). Typical use, one client per process:

    client = BackendClient()
    endpoint, stream = await client.stream_with_failover(endpoints, {"prompt": token_ids, "max_tokens": 256,
                                                                     "temperature": 0.6, "cache_salt": tenant_salt})
    async with contextlib.aclosing(stream):          # leaving early closes the connection: the backend aborts
        async for chunk in stream:
            forward(chunk.text)                      # "" on the final usage-only chunk
            usage = chunk.usage or usage             # prompt / completion / cached tokens so far
    await client.aclose()                            # at shutdown

The body is sent as given (plus `stream` and `stream_options` asking for `include_usage` and
`continuous_usage_stats`, which vLLM and trtllm-serve declare), shaped for each endpoint's kind of
server (`Endpoint.shape`, `backends.client.kinds`): a plain OpenAI server gets no `cache_salt`, a
server that does not take `return_token_ids` does not get it. vLLM's and SGLang's KV events come
over ZMQ (`zmq_events.EventSubscriber`, decoded by `engine_events`), not through this client.

    client.py           `BackendClient`: streams with failover, the one seam to every backend
    http.py             the HTTP/1.1 connection pool under it
    http_connection.py  one keep-alive connection, its responses parsed with httptools
    sse.py              server-sent events decoded from the response body
    types.py            `Endpoint`, `CompletionChunk` and the other plain data the client returns
    errors.py           the error tree (`BackendError` and its subclasses), drawn once
    kinds/              the kinds of backend server, one module each
    adapters.py         the LoRA adapters loaded on each vLLM endpoint (loaded before a request names one)
    zmq_events.py       a subscriber to vLLM's and SGLang's ZMQ KV event streams
    engine_events.py    those events decoded into the gateway's KV events
"""

from __future__ import annotations

from backends.client.client import BackendClient
from backends.client.errors import (
    BackendError,
    BackendOverloaded,
    BackendRejected,
    BackendStreamBroken,
    BackendTimeout,
    BackendUnavailable,
    ClientAtCapacity,
)
from backends.client.types import CompletionChunk, ContextAnswer, Endpoint
from contracts.usage import Usage

__all__ = [
    "BackendClient",
    "BackendError",
    "BackendOverloaded",
    "BackendRejected",
    "BackendStreamBroken",
    "BackendTimeout",
    "BackendUnavailable",
    "ClientAtCapacity",
    "CompletionChunk",
    "ContextAnswer",
    "Endpoint",
    "Usage",
]
