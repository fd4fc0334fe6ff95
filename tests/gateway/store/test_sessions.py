from __future__ import annotations

import asyncio

import pytest

from gateway.store import InvalidArgument, Store
from tests.gateway.store.conftest import OpenStore


async def test_session_pins_a_backend_per_tenant(pair: tuple[Store, Store]) -> None:
    a, b = pair
    assert await a.get_session("acme", "chat-1") is None
    await a.set_session("acme", "chat-1", "backend-7")
    assert await b.get_session("acme", "chat-1") == "backend-7"
    assert await b.get_session("beta", "chat-1") is None  # the same session id from another tenant
    await b.set_session("acme", "chat-1", "backend-2")
    assert await a.get_session("acme", "chat-1") == "backend-2"
    await a.delete_session("acme", "chat-1")
    assert await b.get_session("acme", "chat-1") is None


async def test_session_expires_after_its_ttl_and_set_renews_it(open_instance: OpenStore) -> None:
    store = open_instance(session_ttl_s=0.6)
    await store.set_session("acme", "old", "backend-1")
    await store.set_session("acme", "renewed", "backend-1")
    await asyncio.sleep(0.35)
    await store.set_session("acme", "renewed", "backend-1")
    await asyncio.sleep(0.35)
    assert await store.get_session("acme", "old") is None
    assert await store.get_session("acme", "renewed") == "backend-1"


async def test_session_ids_are_checked(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        await store.set_session("acme", "x" * 257, "backend-1")
    with pytest.raises(InvalidArgument):
        await store.set_session("acme", "", "backend-1")
    with pytest.raises(InvalidArgument):
        await store.set_session("a:b", "s", "backend-1")
    await store.set_session("acme", "any text: even colons", "backend-1")
    assert await store.get_session("acme", "any text: even colons") == "backend-1"


async def test_embedded_sessions_are_size_bounded(kind: str, open_instance: OpenStore) -> None:
    if kind not in ("embedded", "hosted"):  # the host keeps an embedded store
        pytest.skip("Redis bounds sessions by TTL (and its maxmemory policy); the shared store at each lease renewal")
    store = open_instance(session_max_entries=3)
    for i in range(5):
        await store.set_session("acme", f"s{i}", f"b{i}")
    assert [await store.get_session("acme", f"s{i}") for i in range(5)] == [None, None, "b2", "b3", "b4"]
