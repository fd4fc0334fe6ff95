"""SGLang's server (`python -m sglang.launch_server`): `cache_salt` namespaces its radix cache per
tenant; KV events on a ZMQ socket with `--kv-events-config` (the same JSON shape as vLLM's);
cached prompt tokens reported only with `--enable-cache-report`. `return_token_ids` is not asked
for unless the backend's `return_token_ids = true` says it takes it. No `/load`."""

from __future__ import annotations

from backends.client.kinds.base import BackendKind

SGLANG = BackendKind(
    name="sglang",
    kv_events="zmq",
    cached_tokens_fix="start SGLang with --enable-cache-report",
)
