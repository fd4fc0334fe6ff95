"""Any other OpenAI-compatible completions server, e.g. llama.cpp's `llama-server`: no KV events
(routing goes by load and session affinity), no `/load`, and none of the extensions the other
kinds take: `cache_salt` (such a server cannot keep tenants' cache entries apart: see the README),
`return_token_ids` and `stream_options.continuous_usage_stats` are left out. Cached prompt tokens
count where the server reports `usage.prompt_tokens_details.cached_tokens` (llama-server does in
builds from 2026 on)."""

from __future__ import annotations

from backends.client.kinds.base import BackendKind

OPENAI = BackendKind(
    name="openai",
    cached_tokens_fix="use a server version that reports usage.prompt_tokens_details.cached_tokens",
    dropped_fields=frozenset({"cache_salt", "return_token_ids", "disaggregated_params"}),
    dropped_stream_options=frozenset({"continuous_usage_stats"}),
)
