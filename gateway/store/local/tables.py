"""The local store's in-memory tables: bounded, synchronous, one event loop's own.

Each method runs without awaiting, so on one asyncio loop every call is atomic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from policies.limits import window_index

K = TypeVar("K")
V = TypeVar("V")


class TtlMap(Generic[K, V]):
    """key -> value, each living `ttl_s` after its last write; at most `max_entries` (oldest write goes first)."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self._entries: OrderedDict[K, tuple[V, float]] = OrderedDict()  # in write order = deadline order
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._entries[key]
            return None
        return entry[0]

    def set(self, key: K, value: V) -> None:
        now = self._clock()
        self._entries[key] = (value, now + self._ttl_s)
        self._entries.move_to_end(key)
        while self._entries:
            _, (_, deadline) = next(iter(self._entries.items()))
            if len(self._entries) <= self._max_entries and deadline > now:
                break
            self._entries.popitem(last=False)

    def delete(self, key: K) -> None:
        self._entries.pop(key, None)


class PrefixTable:
    """block hash -> {backend: last recorded}, LRU by last record, at most `max_entries` hashes."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self._entries: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        now = self._clock()
        # Last to first: the leading blocks become the most recent, and a match needs an
        # unbroken run from the first block, so the tail is what the cap evicts first.
        for h in reversed(block_hashes):
            holders = self._entries.get(h)
            if holders is None:
                holders = self._entries[h] = {}
            else:
                self._entries.move_to_end(h)
            holders[backend_id] = now
        # The front entry is the least recently recorded: drop it while over the cap or stale.
        while self._entries:
            holders = next(iter(self._entries.values()))
            if len(self._entries) <= self._max_entries and max(holders.values()) > now - self._ttl_s:
                break
            self._entries.popitem(last=False)

    def remove(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        for h in block_hashes:
            holders = self._entries.get(h)
            if holders is not None:
                holders.pop(backend_id, None)
                if not holders:
                    del self._entries[h]

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        fresh_after = self._clock() - self._ttl_s
        return leading_runs(
            block_hashes, lambda h: {b for b, seen in self._entries.get(h, {}).items() if seen > fresh_after}
        )


def leading_runs(block_hashes: Sequence[int], holders_of: Callable[[int], set[str]]) -> dict[str, int]:
    """For each backend, how many leading blocks of the chain it holds (backends with 0 left out)."""
    matched: dict[str, int] = {}
    alive: set[str] | None = None  # backends holding every block so far
    for i, h in enumerate(block_hashes):
        holders = holders_of(h)
        if alive is None:
            alive = holders
        else:
            for b in alive - holders:
                matched[b] = i
            alive &= holders
        if not alive:
            break
    for b in alive or ():
        matched[b] = len(block_hashes)
    return matched


class WindowCounters:
    """Per-scope counts of the current and previous fixed window (the sliding window's two counters)."""

    _SWEEP_EVERY = 4096

    def __init__(self, window_ms: int) -> None:
        self._window_ms = window_ms
        self._counters: dict[str, list[int]] = {}  # scope -> [window index, current, previous]
        self._ops = 0

    def __len__(self) -> int:
        return len(self._counters)

    def counts(self, scope: str, now_ms: int) -> tuple[int, int]:
        """(previous, current) window counts at `now_ms`."""
        entry = self._roll(scope, now_ms)
        return entry[2], entry[1]

    def add(self, scope: str, now_ms: int, delta: int) -> None:
        """Add `delta` to the current window; a negative one takes from current, then previous, down to 0."""
        entry = self._roll(scope, now_ms)
        if delta >= 0:
            entry[1] += delta
            return
        take = min(entry[1], -delta)
        entry[1] -= take
        entry[2] = max(0, entry[2] - (-delta - take))

    def _roll(self, scope: str, now_ms: int) -> list[int]:
        self._ops += 1
        if self._ops % self._SWEEP_EVERY == 0:
            self._sweep(now_ms)
        index = window_index(now_ms, self._window_ms)
        entry = self._counters.get(scope)
        if entry is None:
            entry = self._counters[scope] = [index, 0, 0]
        elif index == entry[0] + 1:
            entry[:] = [index, 0, entry[1]]
        elif index > entry[0] + 1:
            entry[:] = [index, 0, 0]
        # index < entry[0]: this caller's clock is behind; count it in the newer window.
        return entry

    def _sweep(self, now_ms: int) -> None:
        oldest_live = window_index(now_ms, self._window_ms) - 1
        for scope in [s for s, e in self._counters.items() if e[0] < oldest_live]:
            del self._counters[scope]
