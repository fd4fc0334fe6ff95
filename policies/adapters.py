"""Where a LoRA adapter is loaded, weighed like a prefix hit.

A request under an adapter runs on any backend of its model (each loads adapters on demand), but one that
has it loaded already starts sooner: loading reads the adapter from disk into the engine's slots. That time
is expressed in prompt tokens (`adapter_load_cost_tokens`, a setting: about what the backend prefills in the
time a load takes) and added to the backend's prefill cost (`Candidate.prefill_cost`), so a backend holding
the adapter wins unless its load exceeds another's by more than that, exactly as a cached prefix does.
Requests without an adapter, and backends that have it, pay nothing.
"""

from __future__ import annotations

from collections.abc import Collection


def adapter_load_tokens(adapter: str | None, resident: Collection[str], load_cost_tokens: int) -> int:
    """The prefill-token cost of serving `adapter` on a backend with adapters `resident` loaded."""
    return 0 if adapter is None or adapter in resident else load_cost_tokens
