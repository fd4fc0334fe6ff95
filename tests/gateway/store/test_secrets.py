"""Server-side secrets: set once, atomically, shared by every replica and kept across restarts."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import Store
from gateway.store.errors import InvalidArgument
from tests.gateway.store.conftest import OpenStore


async def test_the_first_candidate_wins_for_every_replica(pair: tuple[Store, Store]) -> None:
    first, second = pair
    values = await asyncio.gather(*(s.get_or_create_secret("salt", f"candidate-{i}")
                                    for i, s in enumerate([first, second, first, second])))
    assert len(set(values)) == 1 and values[0].startswith("candidate-")
    assert await second.get_or_create_secret("salt", "later") == values[0]
    assert await first.get_or_create_secret("other", "x") == "x"  # names are independent


async def test_the_secret_survives_a_restart(open_instance: OpenStore) -> None:
    store = open_instance()
    kept = await store.get_or_create_secret("salt", "kept")
    await store.aclose()
    assert await open_instance().get_or_create_secret("salt", "new") == kept


async def test_bad_names_are_refused(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        await store.get_or_create_secret("a:b", "x")
