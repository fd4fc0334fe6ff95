"""Tenancy (gateway/store/tenancy.py): tenants, keys, revocation and server-side secrets, per backend."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from gateway.store import Conflict, InvalidArgument, NotFound, Store
from tests.gateway.store.conftest import OpenStore


async def test_tenant_create_get_by_account_and_list(store: Store) -> None:
    acme = await store.tenancy.create_tenant("Acme", ["acct1", "acct2"], allowed_models=["@cf/meta/llama-3.1-8b-instruct"],
                                     monthly_budget_micro=5_000_000)
    beta = await store.tenancy.create_tenant("Beta", ["acct3"], tenant_id="beta")
    assert beta.id == "beta" and beta.allowed_models is None and beta.monthly_budget_micro is None
    assert await store.tenancy.get_tenant(acme.id) == acme
    assert await store.tenancy.get_tenant_by_account("acct2") == acme
    assert await store.tenancy.get_tenant_by_account("acct3") == beta
    assert await store.tenancy.get_tenant_by_account("nobody") is None
    assert await store.tenancy.get_tenant("missing") is None
    assert [t.id for t in await store.tenancy.list_tenants()] == [acme.id, "beta"]
    assert acme.allows_model("@cf/meta/llama-3.1-8b-instruct") and not acme.allows_model("@cf/other")


async def test_tenant_conflicts_write_nothing(store: Store) -> None:
    await store.tenancy.create_tenant("Acme", ["acct1"], tenant_id="acme")
    with pytest.raises(Conflict, match="acme"):
        await store.tenancy.create_tenant("Again", ["acct9"], tenant_id="acme")
    with pytest.raises(Conflict, match="acct1"):
        await store.tenancy.create_tenant("Other", ["acct8", "acct1"], tenant_id="other")
    assert await store.tenancy.get_tenant("other") is None
    assert await store.tenancy.get_tenant_by_account("acct8") is None  # the free account was not claimed either
    assert len(await store.tenancy.list_tenants()) == 1


async def test_concurrent_claims_of_one_account_let_exactly_one_win(pair: tuple[Store, Store]) -> None:
    a, b = pair
    results = await asyncio.gather(
        *(s.tenancy.create_tenant(f"T{i}", ["shared-acct"], tenant_id=f"t{i}") for i, s in enumerate([a, b] * 5)),
        return_exceptions=True,
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, Conflict) for r in results if isinstance(r, BaseException))


@pytest.mark.parametrize(
    "kwargs",
    [{"tenant_id": "has:colon"}, {"tenant_id": ""}, {"account_ids": []}, {"account_ids": "acct"},
     {"account_ids": ["a", "a"]}, {"monthly_budget_micro": -1}, {"allowed_models": "one-model"}, {"name": ""}],
)
async def test_bad_tenant_input_is_refused(store: Store, kwargs: dict[str, Any]) -> None:
    args = {"name": "Acme", "account_ids": ["acct1"]} | kwargs
    name, accounts = args.pop("name"), args.pop("account_ids")
    with pytest.raises(InvalidArgument):
        await store.tenancy.create_tenant(name, accounts, **args)


async def test_created_secret_works_wrong_secret_fails(store: Store) -> None:
    tenant = await store.tenancy.create_tenant("Acme", ["acct1"])
    key, secret = await store.tenancy.create_key(tenant.id, allowed_models=["m1"], rpm=60, tpm=10_000)
    assert secret.startswith("edg_") and len(secret) == 52 and key.prefix == secret[:10]
    found = await store.tenancy.lookup_key(secret)
    assert found == key
    assert found.tenant_id == tenant.id and found.rpm == 60 and found.tpm == 10_000
    assert found.allows_model("m1") and not found.allows_model("m2")
    assert await store.tenancy.lookup_key(secret[:-1] + ("0" if secret[-1] != "0" else "1")) is None
    assert await store.tenancy.lookup_key(secret + "x") is None
    assert await store.tenancy.lookup_key("") is None
    assert await store.tenancy.lookup_key("sk-" + secret[4:]) is None
    other_key, other_secret = await store.tenancy.create_key(tenant.id)
    assert other_secret != secret and (await store.tenancy.lookup_key(other_secret)).id == other_key.id


async def test_create_key_for_unknown_tenant(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.tenancy.create_key("ghost")


async def test_listing_never_exposes_hashes_or_secrets(store: Store) -> None:
    tenant = await store.tenancy.create_tenant("Acme", ["acct1"])
    other = await store.tenancy.create_tenant("Other", ["acct2"])
    key1, secret1 = await store.tenancy.create_key(tenant.id)
    key2, secret2 = await store.tenancy.create_key(tenant.id, rpm=5)
    await store.tenancy.create_key(other.id)
    listed = await store.tenancy.list_keys(tenant.id)
    assert [k.id for k in listed] == [key1.id, key2.id]
    for key, secret in zip(listed, (secret1, secret2)):
        values = [str(v) for v in dataclasses.asdict(key).values()]
        assert all(secret not in v and secret[10:20] not in v for v in values)
        assert all(len(v) != 64 for v in values)  # no sha256 hex anywhere
        assert not any("hash" in f.name for f in dataclasses.fields(key))


async def test_revoked_key_fails_everywhere_at_once(pair: tuple[Store, Store]) -> None:
    a, b = pair
    tenant = await a.tenancy.create_tenant("Acme", ["acct1"])
    key, secret = await a.tenancy.create_key(tenant.id)
    assert (await b.tenancy.lookup_key(secret)).id == key.id  # replica b has seen (maybe cached) it
    assert await a.tenancy.revoke_key(key.id) is True
    # The contract is "within one second"; both stores manage it without waiting at all.
    assert await b.tenancy.lookup_key(secret) is None
    assert await a.tenancy.lookup_key(secret) is None
    assert (await b.tenancy.get_key(key.id)).is_revoked
    assert await a.tenancy.revoke_key(key.id) is True
    assert await a.tenancy.revoke_key("key_missing") is False


async def test_keys_and_tenants_survive_reopen(open_instance: OpenStore) -> None:
    first = open_instance()
    tenant = await first.tenancy.create_tenant("Acme", ["acct1"], allowed_models=["m1"], monthly_budget_micro=7)
    key, secret = await first.tenancy.create_key(tenant.id, rpm=3)
    revoked, revoked_secret = await first.tenancy.create_key(tenant.id)
    await first.tenancy.revoke_key(revoked.id)
    await first.aclose()
    second = open_instance()
    assert await second.tenancy.get_tenant(tenant.id) == tenant
    assert await second.tenancy.get_tenant_by_account("acct1") == tenant
    assert await second.tenancy.lookup_key(secret) == key
    assert await second.tenancy.lookup_key(revoked_secret) is None
    assert [k.is_revoked for k in await second.tenancy.list_keys(tenant.id)] == [False, True]


async def test_records_handed_out_are_the_callers_own(store: Store) -> None:
    # the stores hand out copies (no checks re-run): a caller that changes one changes nothing stored
    tenant = await store.tenancy.create_tenant("Acme", ["acct1"], tenant_id="acme", monthly_budget_micro=5)
    key, secret = await store.tenancy.create_key("acme", rpm=10)
    for got in (tenant, await store.tenancy.get_tenant("acme"), await store.tenancy.get_tenant_by_account("acct1")):
        assert got is not None
        got.monthly_budget_micro, got.name = None, "changed"
    for got_key in (key, await store.tenancy.lookup_key(secret), await store.tenancy.get_key(key.id)):
        assert got_key is not None
        got_key.rpm, got_key.revoked_at = None, 1.0
    for again in (await store.tenancy.get_tenant("acme"), await store.tenancy.get_tenant_by_account("acct1")):
        assert again is not None and (again.name, again.monthly_budget_micro) == ("Acme", 5)
    for again_key in (await store.tenancy.lookup_key(secret), await store.tenancy.get_key(key.id)):
        assert again_key is not None and (again_key.rpm, again_key.revoked_at) == (10, None)


async def test_the_first_candidate_wins_for_every_replica(pair: tuple[Store, Store]) -> None:
    first, second = pair
    values = await asyncio.gather(*(s.tenancy.get_or_create_secret("salt", f"candidate-{i}")
                                    for i, s in enumerate([first, second, first, second])))
    assert len(set(values)) == 1 and values[0].startswith("candidate-")
    assert await second.tenancy.get_or_create_secret("salt", "later") == values[0]
    assert await first.tenancy.get_or_create_secret("other", "x") == "x"  # names are independent


async def test_the_secret_survives_a_restart(open_instance: OpenStore) -> None:
    store = open_instance()
    kept = await store.tenancy.get_or_create_secret("salt", "kept")
    await store.aclose()
    assert await open_instance().tenancy.get_or_create_secret("salt", "new") == kept


async def test_bad_names_are_refused(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        await store.tenancy.get_or_create_secret("a:b", "x")
