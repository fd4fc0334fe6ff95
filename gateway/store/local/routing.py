"""`MemoryRouting`: the one-process store's routing state, in this process's memory.

Sessions, the prefix index and in-flight tokens (tables.py). Every method completes without
awaiting, so each is atomic on the event loop. After a restart they start empty, which costs some
cache affinity; this process is the only replica, so in-flight tokens need no lease. TTLs here
never leave the process, so they run on the monotonic clock (immune to NTP steps).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from gateway.store.admission import Inflight
from gateway.store.checks import check_hashes, check_id, check_text, check_tokens
from gateway.store.local.tables import PrefixTable, TtlMap
from gateway.store.routing import Loads, RouteKey, RouteView
from gateway.store.settings import StoreSettings


class MemoryRouting:
    def __init__(self, settings: StoreSettings) -> None:
        self._sessions: TtlMap[tuple[str, str], str] = TtlMap(
            settings.session_max_entries, settings.session_ttl_s, time.monotonic
        )
        self._prefixes = PrefixTable(settings.prefix_index_max_entries, settings.prefix_index_ttl_s, time.monotonic)
        self._inflight: dict[str, list[int]] = {}  # backend -> [prefill, decode]

    async def lookup(self, key: RouteKey) -> RouteView:
        previous = None if key.session_id is None else self._sessions.get(_session_key(key.tenant_id, key.session_id))
        matched = self._prefixes.match(list(key.block_hashes)) if key.block_hashes else {}
        return RouteView(self.current_loads(), matched, previous)

    async def started(self, backend_id: str, key: RouteKey, moved: Inflight | None = None) -> None:
        check_text("backend id", backend_id)
        hashes = list(key.block_hashes)
        session = None if key.session_id is None else _session_key(key.tenant_id, key.session_id)
        if moved is not None:
            self.change(moved, sign=-1)
            self.change(Inflight(backend_id, moved.prefill_tokens, moved.decode_tokens), sign=1)
        if hashes:
            self._prefixes.record(backend_id, hashes)
        if session is not None:
            self._sessions.set(session, backend_id)

    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        self._prefixes.record(check_text("backend id", backend_id), check_hashes(block_hashes))

    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        self._prefixes.remove(backend_id, check_hashes(block_hashes))

    async def add_inflight(self, inflight: Inflight) -> None:
        self.change(inflight, sign=1)

    async def release_inflight(self, inflight: Inflight) -> None:
        self.change(inflight, sign=-1)

    def change(self, inflight: Inflight, sign: int) -> None:
        """Count (1) or uncount (-1) tokens, at once (admission calls it inside its own steps)."""
        counts = self._inflight.setdefault(inflight.backend_id, [0, 0])
        counts[0] = max(0, counts[0] + sign * inflight.prefill_tokens)
        counts[1] = max(0, counts[1] + sign * inflight.decode_tokens)
        if counts == [0, 0]:
            del self._inflight[inflight.backend_id]

    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        self._inflight.pop(backend_id, None)
        self.change(Inflight(backend_id, prefill_tokens, decode_tokens), sign=1)

    async def loads(self) -> Loads:
        return self.current_loads()

    def current_loads(self) -> Loads:
        return {b: (p, d) for b, (p, d) in self._inflight.items()}


def _session_key(tenant_id: str, session_id: str) -> tuple[str, str]:
    return check_id("tenant id", tenant_id), check_text("session id", session_id)
