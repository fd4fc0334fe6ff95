"""What each worker's connection holds on the store host: request slots and in-flight tokens.

The host's `EmbeddedStore` keeps the totals; this keeps each connection's share, so that when a
worker's connection closes (the worker stopped, or was killed) its slots and tokens are freed at
once instead of after a lease. In-flight tokens follow the Redis store's per-replica rule: a
release never takes a connection's own count below zero, and `correct_inflight` sets the total to
the backend's report but never below what the other connections hold.

Every method here completes without suspending (the embedded store's memory calls), so each
change to a total and to its owner's share is one atomic step on the host's event loop.
"""

from __future__ import annotations

from collections.abc import Hashable

from gateway.store.checks import check_tokens
from gateway.store.embedded import EmbeddedStore

Owner = Hashable  # one per connection


class Holdings:
    def __init__(self, store: EmbeddedStore) -> None:
        self._store = store
        self._slots: dict[Owner, set[tuple[str, str]]] = {}  # owner -> (tenant, request id)
        self._slot_owner: dict[tuple[str, str], Owner] = {}
        self._tokens: dict[Owner, dict[str, list[int]]] = {}  # owner -> backend -> [prefill, decode]

    # --- request slots ---

    async def acquire_request_slot(self, owner: Owner, tenant_id: str, request_id: str, limit: int) -> bool:
        if not await self._store.acquire_request_slot(tenant_id, request_id, limit):
            return False
        slot = (tenant_id, request_id)
        previous = self._slot_owner.get(slot)
        if previous is not None and previous != owner:
            self._slots[previous].discard(slot)
        self._slot_owner[slot] = owner
        self._slots.setdefault(owner, set()).add(slot)
        return True

    async def release_request_slot(self, owner: Owner, tenant_id: str, request_id: str) -> None:
        """Any connection may release any slot (as any replica may)."""
        await self._store.release_request_slot(tenant_id, request_id)
        holder = self._slot_owner.pop((tenant_id, request_id), None)
        if holder is not None:
            self._slots[holder].discard((tenant_id, request_id))

    # --- in-flight tokens ---

    async def add_inflight(self, owner: Owner, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        mine = self._tokens.setdefault(owner, {}).setdefault(backend_id, [0, 0])
        await self._set(owner, backend_id, mine, mine[0] + prefill_tokens, mine[1] + decode_tokens)

    async def release_inflight(self, owner: Owner, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        mine = self._tokens.get(owner, {}).get(backend_id, [0, 0])
        await self._set(owner, backend_id, mine, max(0, mine[0] - prefill_tokens), max(0, mine[1] - decode_tokens))

    async def correct_inflight(self, owner: Owner, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        others = [0, 0]
        for holder, counts in self._tokens.items():
            if holder != owner and backend_id in counts:
                others[0] += counts[backend_id][0]
                others[1] += counts[backend_id][1]
        mine = self._tokens.get(owner, {}).get(backend_id, [0, 0])
        await self._set(owner, backend_id, mine, max(0, prefill_tokens - others[0]), max(0, decode_tokens - others[1]))

    async def _set(self, owner: Owner, backend_id: str, mine: list[int], prefill: int, decode: int) -> None:
        """Move the owner's share (and with it the total) to (prefill, decode)."""
        up = (max(0, prefill - mine[0]), max(0, decode - mine[1]))
        down = (max(0, mine[0] - prefill), max(0, mine[1] - decode))
        if up != (0, 0):
            await self._store.add_inflight(backend_id, *up)
        if down != (0, 0):
            await self._store.release_inflight(backend_id, *down)
        if (prefill, decode) == (0, 0):
            self._tokens.get(owner, {}).pop(backend_id, None)
        else:
            self._tokens.setdefault(owner, {})[backend_id] = [prefill, decode]

    # --- a connection's end ---

    async def release_all(self, owner: Owner) -> tuple[int, int]:
        """Free everything `owner` holds; returns (slots, backends) freed."""
        slots = self._slots.pop(owner, set())
        for tenant_id, request_id in slots:
            del self._slot_owner[(tenant_id, request_id)]
            await self._store.release_request_slot(tenant_id, request_id)
        tokens = self._tokens.pop(owner, {})
        for backend_id, (prefill, decode) in tokens.items():
            await self._store.release_inflight(backend_id, prefill, decode)
        return len(slots), len(tokens)
