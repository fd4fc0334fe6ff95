"""Our own backend (`edgerun backend`): everything the gateway sends, KV events polled from
`POST /kv_cache_events` with a cursor per gateway replica, `/load`, and cached tokens on every
usage report."""

from __future__ import annotations

from backends.client.kinds.base import BackendKind

EDGERUN = BackendKind(
    name="edgerun",
    kv_events="poll",
    has_load_route=True,
    returns_token_ids=True,
    cached_tokens_fix=None,
)
