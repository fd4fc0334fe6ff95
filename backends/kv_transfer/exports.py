"""The prefill side's pinned KV, as the event loop sees it: which pins exist and for how long.

The engine holds the block references (engines/builtin/engine/kv_pins.py); this registry decides when
to give them back. A pull `lease`s the pin (so the TTL cannot take it while bytes flow), then
`finish`es it: a completed pull releases it, a broken one leaves it for another decode backend to
pull. Pins nobody pulled within `ttl_s` are released by `expire` (run by the backend's lifespan)
and counted, so a crashed decode backend or an abandoned request never leaks blocks for long.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from backends.kv_transfer.errors import PinNotFound
from engines.base import KVPin


@dataclass(slots=True)
class Export:
    pin: KVPin
    expires_at: float  # time.monotonic()
    is_leased: bool = False


class KVExports:
    def __init__(self, ttl_s: float, release: Callable[[int], Awaitable[None]]) -> None:
        self.ttl_s = ttl_s
        self._release = release  # gives the pin's blocks back to the engine
        self._exports: dict[int, Export] = {}
        self.num_expired = 0
        self.num_released = 0

    def __len__(self) -> int:
        return len(self._exports)

    def add(self, pin: KVPin) -> None:
        self._exports[pin.pin_id] = Export(pin, time.monotonic() + self.ttl_s)

    def lease(self, pin_id: int) -> KVPin:
        export = self._exports.get(pin_id)
        if export is None:
            raise PinNotFound(
                f"KV pin {pin_id} is unknown here: it expired (kv_pin_ttl_s={self.ttl_s:g}), was already "
                "pulled, or its backend restarted; run the context step again"
            )
        if export.is_leased:
            raise PinNotFound(f"KV pin {pin_id} is being pulled by another decode backend right now")
        export.is_leased = True
        return export.pin

    async def finish(self, pin_id: int, *, pulled: bool) -> None:
        """The lease is over: release the pin if the pull completed, else let it be pulled again."""
        export = self._exports.get(pin_id)
        if export is None:
            return
        if not pulled:
            export.is_leased = False
            return
        del self._exports[pin_id]
        self.num_released += 1
        await self._release(pin_id)

    async def expire(self, now: float | None = None) -> int:
        """Release every unleased pin past its TTL; returns how many."""
        now = time.monotonic() if now is None else now
        stale = [pin_id for pin_id, e in self._exports.items() if not e.is_leased and e.expires_at <= now]
        for pin_id in stale:
            del self._exports[pin_id]
            await self._release(pin_id)
        self.num_expired += len(stale)
        return len(stale)

    async def release_all(self) -> None:
        for pin_id in list(self._exports):
            del self._exports[pin_id]
            await self._release(pin_id)
