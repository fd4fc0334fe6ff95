"""A store whose every call is counted: the real store's concerns, each wrapped, and (on Redis) every
command sent, so a test can say how many calls a request made and how many round trips each took."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from gateway.store import Store


class CountedConcern:
    """One concern of a store, each of its public calls appended (as "concern.method") to `calls`."""

    def __init__(self, inner: Any, name: str, counts: Counts) -> None:
        self._inner = inner
        self._name = name
        self._counts = counts

    def __getattr__(self, attr: str) -> Any:
        found = getattr(self._inner, attr)
        if attr.startswith("_") or not callable(found):
            return found
        label = f"{self._name}.{attr}"
        if inspect.isasyncgenfunction(found):
            def iterate(*args: Any, **kwargs: Any) -> Any:
                self._counts.calls.append(label)
                return found(*args, **kwargs)

            return iterate

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._counts.calls.append(label)
            try:
                return await found(*args, **kwargs)
            finally:
                self._counts.round_trips_after[label] = self._counts.round_trips

        return call


class Counts:
    """What a counted store was asked: `calls` (concern.method, in order) and, on Redis, `round_trips`
    (commands sent to Redis, a script being one)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.round_trips = 0
        self.round_trips_after: dict[str, int] = {}  # call -> round trips counted once it had returned

    def reset(self) -> None:
        self.calls.clear()
        self.round_trips = 0
        self.round_trips_after.clear()


def counted(store: Store, counts: Counts) -> Store:
    """`store` with every call counted into `counts`."""
    redis_client = getattr(getattr(store.routing, "_c", None), "redis", None)
    if redis_client is not None:
        send: Callable[..., Any] = redis_client.execute_command

        async def execute_command(*args: Any, **options: Any) -> Any:
            counts.round_trips += 1
            return await send(*args, **options)

        redis_client.execute_command = execute_command
    parts = {name: CountedConcern(getattr(store, name), name, counts)
             for name in ("tenancy", "admission", "routing", "ledger", "cache")}
    return Store(parts["tenancy"], parts["admission"], parts["routing"], parts["ledger"], parts["cache"],  # type: ignore[arg-type]
                 store.queue, store.aclose, adapters=store.adapters)  # the batch queue: background work on its own connections
