"""What the gateway must know about one kind of backend server, in one small value.

A `BackendKind` says how KV events arrive from such a server (polled over HTTP, a ZMQ stream, or
none), whether it serves our `/load` snapshot, whether it takes `return_token_ids`, which
request fields it must not be sent, whether a LoRA adapter must be loaded on it before it is called
by name, and how an operator makes it report cached prompt tokens.
The backend client shapes every request with `shape` just before sending it to an endpoint of
that kind, so one request body serves a failover list that mixes kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

KVEventDelivery = Literal["poll", "zmq"]


@dataclass(frozen=True, slots=True)
class BackendKind:
    name: str
    # what the operator does when answers carry no `prompt_tokens_details.cached_tokens`
    # (None: this kind always reports them)
    cached_tokens_fix: str | None
    # The defaults below are a plain OpenAI-compatible server's; a kind states only where it differs.
    # how the server reports its KV cache: "poll" (POST /kv_cache_events, TensorRT-LLM's JSON),
    # "zmq" (a PUB socket, backends.client.zmq_events), or None (it does not)
    kv_events: KVEventDelivery | None = None
    has_load_route: bool = False  # GET /load: our backend's token-level load snapshot
    returns_token_ids: bool = False  # takes `return_token_ids` and sends each chunk's ids (default of [[backends]])
    dropped_fields: frozenset[str] = frozenset()  # request fields this server must not get
    # serves a LoRA adapter by name once it is loaded through POST /v1/load_lora_adapter (vLLM's
    # runtime loading): the client loads a request's adapter there first (backends.client.adapters)
    loads_adapters: bool = False
    dropped_stream_options: frozenset[str] = frozenset()

    def shape(self, body: dict[str, Any], *, return_token_ids: bool) -> dict[str, Any]:
        """`body` as this kind of server takes it: without the fields it does not take, and without
        `return_token_ids` unless asked for (`return_token_ids`: the backend's setting)."""
        drop = self.dropped_fields if return_token_ids else self.dropped_fields | {"return_token_ids"}
        if not drop.intersection(body) and not self.dropped_stream_options:
            return body
        shaped = {key: value for key, value in body.items() if key not in drop}
        options = shaped.get("stream_options")
        if self.dropped_stream_options and isinstance(options, dict):
            shaped["stream_options"] = {k: v for k, v in options.items() if k not in self.dropped_stream_options}
        return shaped
