"""The client every gateway component uses to reach a backend (see `client.BackendClient`).

Public API: `Endpoint`, `BackendClient`, `CompletionChunk`, `Usage`, and the error tree in
`errors` (`BackendError` and its subclasses). Typical use, one client per process:

    client = BackendClient()
    endpoint, stream = await client.stream_with_failover(endpoints, {"prompt": token_ids, "max_tokens": 256,
                                                                     "temperature": 0.6, "cache_salt": tenant_salt})
    async with contextlib.aclosing(stream):          # leaving early closes the connection: the backend aborts
        async for chunk in stream:
            if chunk.usage is not None: ...          # the last chunk: prompt / completion / cached tokens
            else: forward(chunk.text)
    await client.aclose()                            # at shutdown

The body is sent as given (plus `stream` and `stream_options.include_usage`), so it must hold only
fields the backend accepts: those of trtllm-serve's and vLLM's /v1/completions.
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
)
from backends.client.types import CompletionChunk, Endpoint, Usage

__all__ = [
    "BackendClient",
    "BackendError",
    "BackendOverloaded",
    "BackendRejected",
    "BackendStreamBroken",
    "BackendTimeout",
    "BackendUnavailable",
    "CompletionChunk",
    "Endpoint",
    "Usage",
]
