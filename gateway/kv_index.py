"""KV cache events -> the store's prefix index.

Backends report their KV blocks in TensorRT-LLM's event shape (`stored` blocks with their
parent hash and tokens, `removed` block hashes). The built-in engine hashes blocks exactly as
`policies.prefix` does, with the `cache_salt` the gateway sends (the tenant id) as the salt, so
its hashes *are* the gateway's and go into the index as they are. Each stored block is checked
first: its hash must equal `hash_block(parent, tokens)`. Blocks from a backend with another
hash scheme (trtllm-serve, vLLM) fail that check and are skipped (counted in `num_skipped`): the
index then relies on what the router recorded when it routed. Removed hashes are removed as
given (a foreign hash is simply not in the index).
"""

from __future__ import annotations

import struct
from typing import Any

from gateway.store.base import Store
from policies.prefix import hash_block


class KVEventIndexer:
    def __init__(self, store: Store, block_size: int) -> None:
        self.store = store
        self.block_size = block_size
        self.num_skipped = 0

    async def apply(self, backend_id: str, events: list[dict[str, Any]]) -> None:
        """Apply one poll's events in order (consecutive events of one kind are sent together)."""
        runs: list[tuple[str, list[int]]] = []
        for event in events:
            data = event.get("data") if isinstance(event, dict) else None
            if not isinstance(data, dict) or data.get("type") not in ("stored", "removed"):
                continue
            if data["type"] == "stored":
                hashes = self._verified(data)
            else:
                hashes = [h for h in data.get("block_hashes") or [] if isinstance(h, int)]
            if not hashes:
                continue
            if runs and runs[-1][0] == data["type"]:
                runs[-1][1].extend(hashes)
            else:
                runs.append((data["type"], hashes))
        for kind, hashes in runs:
            if kind == "stored":
                await self.store.record_prefix(backend_id, hashes)
            else:
                await self.store.remove_prefix(backend_id, hashes)

    def _verified(self, data: dict[str, Any]) -> list[int]:
        """The stored blocks whose hashes follow our chain (stops at the first that does not)."""
        parent = data.get("parent_hash")
        hashes: list[int] = []
        for block in data.get("blocks") or []:
            tokens = [t.get("token_id") for t in block.get("tokens") or []]
            claimed = block.get("block_hash")
            ok = (
                isinstance(parent, int)
                and isinstance(claimed, int)
                and len(tokens) == self.block_size
                and all(isinstance(t, int) for t in tokens)
            )
            if not ok or hash_block(parent, struct.pack(f"<{len(tokens)}i", *tokens)) != claimed:
                self.num_skipped += 1
                break
            hashes.append(claimed)
            parent = claimed
        return hashes
