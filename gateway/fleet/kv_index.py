"""KV cache events -> the store's prefix index.

Backends report their KV blocks in TensorRT-LLM's event shape (`stored` blocks with their
parent hash and tokens, `removed` block hashes). The built-in engine hashes blocks with the one
chain of `contracts.prefix_hash`, as the router does, with the `cache_salt` the gateway sends (the tenant's derived salt,
`gateway.pipeline.tenant_salt`) as the salt, so its hashes *are* the gateway's and go into the index as
they are.

Our backends send no token ids by default (they would reveal prompts to whoever reads the
events): such blocks are recorded as reported, which is safe because the backend is
authenticated and a hash of any other scheme simply never matches a prompt's chain. A block
that does carry tokens (trtllm-serve sends them, and ours when `kv_events_include_tokens` is
on) is checked first: its hash must equal `block_hash(parent, tokens)`. Blocks from a backend
with another hash scheme fail that check and are skipped (counted in `num_skipped`): the index
then relies on what the router recorded when it routed. Removed hashes are removed as given (a
foreign hash is simply not in the index).

Each event's `medium` (kv_tiers.py) says which index keys it changes: the backend's pool, its pool
or host tier, or its region's shared pool; an event without one is about the pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contracts.prefix_hash import block_hash
from gateway.fleet.kv_tiers import index_keys
from gateway.store.routing import RoutingState

_INT64 = (-(2**63), 2**63 - 1)  # what the index stores


class KVEventIndexer:
    def __init__(self, routing: RoutingState, block_size: int, regions: Mapping[str, str] | None = None) -> None:
        self.routing = routing
        self.block_size = block_size
        self.regions = regions or {}  # backend id -> its region (whose shared pool its REGION events are about)
        self.num_skipped = 0

    async def apply(self, backend_id: str, events: list[dict[str, Any]]) -> None:
        """Apply one poll's events in order (consecutive events of one kind and tier are sent together)."""
        region = self.regions.get(backend_id, "default")
        runs: list[tuple[str, str, list[int]]] = []
        for event in events:
            data = event.get("data") if isinstance(event, dict) else None
            if not isinstance(data, dict) or data.get("type") not in ("stored", "removed"):
                continue
            if data["type"] == "stored":
                hashes = self._verified(data)
            else:
                reported = data.get("block_hashes") or []
                hashes = [h for h in reported if isinstance(h, int) and _INT64[0] <= h <= _INT64[1]]
            if not hashes:
                continue
            medium = data.get("medium")
            for key in index_keys(backend_id, region, data["type"], medium if isinstance(medium, str) else None):
                if runs and runs[-1][:2] == (data["type"], key):
                    runs[-1][2].extend(hashes)
                else:
                    runs.append((data["type"], key, list(hashes)))
        for kind, key, hashes in runs:
            if kind == "stored":
                await self.routing.record_prefix(key, hashes)
            else:
                await self.routing.remove_prefix(key, hashes)

    def _verified(self, data: dict[str, Any]) -> list[int]:
        """The stored blocks whose hashes follow our chain (stops at the first that does not);
        blocks reported without tokens are taken as they are."""
        parent = data.get("parent_hash")
        hashes: list[int] = []
        for block in data.get("blocks") or []:
            tokens = [t.get("token_id") for t in block.get("tokens") or []]
            claimed = block.get("block_hash")
            if not isinstance(claimed, int) or isinstance(claimed, bool) or not _INT64[0] <= claimed <= _INT64[1]:
                self.num_skipped += 1
                break
            if not tokens:  # hashes only
                hashes.append(claimed)
                parent = claimed
                continue
            if (
                not isinstance(parent, int)
                or len(tokens) != self.block_size
                or not all(isinstance(t, int) for t in tokens)
                or block_hash(parent, tokens) != claimed
            ):
                self.num_skipped += 1
                break
            hashes.append(claimed)
            parent = claimed
        return hashes
