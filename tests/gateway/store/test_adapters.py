"""Adapters (gateway/store/adapters.py): tenants' finetunes, per backend (local file, Redis)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import Conflict, NotFound, Store
from gateway.store.adapters import new_finetune

MODEL = "@cf/huggingface/smollm2-135m-instruct"


async def test_create_get_by_id_or_name_list_and_delete(store: Store) -> None:
    first = new_finetune("acct1", "french", MODEL, "answers in French")
    second = new_finetune("acct1", "pirate", MODEL)
    await store.adapters.create_finetune(first, 100)
    await store.adapters.create_finetune(second, 100)
    assert await store.adapters.get_finetune("acct1", first.id) == first
    assert await store.adapters.get_finetune("acct1", "pirate") == second
    assert await store.adapters.get_finetune("acct2", first.id) is None, "another account never sees it"
    assert await store.adapters.get_finetune("acct1", "missing") is None
    assert [f.id for f in await store.adapters.list_finetunes("acct1")] == [first.id, second.id]
    assert await store.adapters.list_finetunes("acct2") == []
    assert not await store.adapters.delete_finetune("acct2", first.id)
    assert await store.adapters.delete_finetune("acct1", first.id)
    assert not await store.adapters.delete_finetune("acct1", first.id)
    assert [f.id for f in await store.adapters.list_finetunes("acct1")] == [second.id]
    again = new_finetune("acct1", "french", MODEL)  # the name is free again
    await store.adapters.create_finetune(again, 100)
    assert await store.adapters.get_finetune("acct1", "french") == again


async def test_names_are_unique_per_account_and_the_cap_holds(store: Store) -> None:
    await store.adapters.create_finetune(new_finetune("acct1", "a", MODEL), 2)
    with pytest.raises(Conflict, match="named 'a'"):
        await store.adapters.create_finetune(new_finetune("acct1", "a", MODEL), 2)
    await store.adapters.create_finetune(new_finetune("acct2", "a", MODEL), 2)  # another account may
    await store.adapters.create_finetune(new_finetune("acct1", "b", MODEL), 2)
    with pytest.raises(Conflict, match="delete one first"):
        await store.adapters.create_finetune(new_finetune("acct1", "c", MODEL), 2)
    assert len(await store.adapters.list_finetunes("acct1")) == 2


async def test_assets_are_recorded_once_each(store: Store) -> None:
    finetune = new_finetune("acct1", "a", MODEL)
    await store.adapters.create_finetune(finetune, 100)
    updated = await store.adapters.add_asset("acct1", finetune.id, "adapter_model.safetensors")
    assert not updated.is_complete
    await store.adapters.add_asset("acct1", finetune.id, "adapter_model.safetensors")
    updated = await store.adapters.add_asset("acct1", finetune.id, "adapter_config.json")
    assert updated.assets == ("adapter_config.json", "adapter_model.safetensors") and updated.is_complete
    assert await store.adapters.get_finetune("acct1", "a") == updated
    with pytest.raises(NotFound):
        await store.adapters.add_asset("acct2", finetune.id, "adapter_config.json")


async def test_concurrent_creates_never_pass_the_cap(store: Store) -> None:
    creates = [store.adapters.create_finetune(new_finetune("acct1", f"n{i}", MODEL), 3) for i in range(8)]
    results = await asyncio.gather(*creates, return_exceptions=True)
    assert sum(r is None for r in results) == 3
    assert all(isinstance(r, Conflict) for r in results if r is not None)
