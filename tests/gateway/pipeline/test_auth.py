"""Keys -> tenants, account and model checks, per-key limits (service level; HTTP in test_api_inference)."""

from __future__ import annotations

import pytest

from gateway.billing.metering import MeteredRequest, Metering
from gateway.context import Principal
from gateway.errors import AccountMismatch, AuthenticationFailed, ModelNotAllowed, RateLimited, RequestTooLarge
from gateway.fleet.catalog import ModelSpec
from gateway.metrics import GatewayMetrics
from gateway.pipeline.auth import Authenticator, bearer_token
from gateway.pipeline.concurrency import TenantSlots
from gateway.pipeline.ticket import Admitter
from gateway.store import Store
from policies.pricing import PriceTable
from tests.gateway.fixtures_context import context_now
from tests.gateway.store.calls import reconcile_tokens


async def admit(auth: Authenticator, principal: Principal, tokens: int) -> None:
    """A request's two counts against its key's limits: its tokens with its admission (tpm,
    gateway/pipeline/ticket.py), the request itself (rpm; on arrival in the gateway)."""
    store = auth.store
    admitter = Admitter(store.admission, Metering(store, PriceTable.from_config({}), GatewayMetrics()), TenantSlots(None))
    ctx = context_now(f"req-{tokens}", principal, ModelSpec(id="m", backend_model="m"))
    await admitter.admit(MeteredRequest(ctx, 0), tokens, 0)
    await auth.admit_request(principal)


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


async def test_key_resolves_to_its_tenant_for_its_accounts(store: Store) -> None:
    await store.tenancy.create_tenant("A", ["acc-a", "acc-a2"], tenant_id="ta")
    _, secret = await store.tenancy.create_key("ta")
    auth = Authenticator(store)
    principal = await auth.authenticate(f"Bearer {secret}", "acc-a2")
    assert principal.tenant.id == "ta" and principal.account_id == "acc-a2"
    with pytest.raises(AccountMismatch) as caught:
        await auth.authenticate(f"Bearer {secret}", "acc-b")
    assert (caught.value.status, caught.value.code) == (403, 10000)


@pytest.mark.parametrize("header", [None, "Bearer edg_" + "0" * 48, "Bearer not-a-key", "Token x"])
async def test_missing_or_unknown_keys_are_401(store: Store, header: str | None) -> None:
    with pytest.raises(AuthenticationFailed) as caught:
        await Authenticator(store).authenticate(header, "acc")
    assert (caught.value.status, caught.value.code) == (401, 10000)


async def test_a_revoked_key_stops_at_once(store: Store) -> None:
    await store.tenancy.create_tenant("A", ["acc"], tenant_id="ta")
    key, secret = await store.tenancy.create_key("ta")
    auth = Authenticator(store)
    await auth.authenticate(f"Bearer {secret}", "acc")
    await store.tenancy.revoke_key(key.id)
    with pytest.raises(AuthenticationFailed):
        await auth.authenticate(f"Bearer {secret}", "acc")


async def test_tenant_and_key_model_allow_lists(store: Store) -> None:
    await store.tenancy.create_tenant("A", ["acc"], tenant_id="ta", allowed_models=["m1", "m2"])
    _, open_secret = await store.tenancy.create_key("ta")
    _, narrow_secret = await store.tenancy.create_key("ta", allowed_models=["m1"])
    auth = Authenticator(store)
    wide = await auth.authenticate(f"Bearer {open_secret}", "acc")
    narrow = await auth.authenticate(f"Bearer {narrow_secret}", "acc")
    auth.authorize_model(wide, "m2")
    auth.authorize_model(narrow, "m1")
    for principal, model in ((wide, "m3"), (narrow, "m2")):
        with pytest.raises(ModelNotAllowed) as caught:
            auth.authorize_model(principal, model)
        assert (caught.value.status, caught.value.code) == (403, 5018)


async def test_limits_refuse_with_retry_after(store: Store) -> None:
    await store.tenancy.create_tenant("A", ["acc"], tenant_id="ta")
    _, secret = await store.tenancy.create_key("ta", rpm=2, tpm=100)
    auth = Authenticator(store)
    principal = await auth.authenticate(f"Bearer {secret}", "acc")
    await admit(auth, principal, 10)
    await admit(auth, principal, 10)
    with pytest.raises(RateLimited) as caught:
        await admit(auth, principal, 10)
    assert caught.value.status == 429 and caught.value.code == 3040
    assert caught.value.retry_after_s is not None and 0 < caught.value.retry_after_s <= 120  # sliding window: < 2 min
    with pytest.raises(RequestTooLarge):  # more than the whole per-minute allowance: waiting never helps
        await admit(auth, principal, 101)


# ---- end to end: one key's limit holds across two gateway processes sharing Redis --------------


async def _limited_key(redis_url: str, prefix: str) -> str:
    from gateway.settings import GatewaySettings
    from gateway.store import open_store

    shared = open_store(GatewaySettings(redis_url=redis_url, key_prefix=prefix).store)
    try:
        await shared.tenancy.create_tenant("Limited", ["acc-l"], tenant_id="tl")
        _, secret = await shared.tenancy.create_key("tl", rpm=3)
        return secret
    finally:
        await shared.aclose()


@pytest.mark.slow
def test_rpm_holds_across_two_gateway_processes(backend_pair, redis_url: str, redis_prefix: str, tmp_path) -> None:  # noqa: ANN001
    import asyncio
    import json

    import httpx

    from gateway.fleet.catalog import DEFAULT_MODEL_ID
    from tests.gateway.fixtures_e2e import start_gateway_process

    secret = asyncio.run(_limited_key(redis_url, redis_prefix))
    env = {
        "EDGERUN_REDIS_URL": redis_url,
        "EDGERUN_KEY_PREFIX": redis_prefix,
        "EDGERUN_BACKENDS": json.dumps([backend_pair[0].spec()]),
        "EDGERUN_TOKENIZER_CACHE_DIR": str(tmp_path / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
    }
    gateways = [start_gateway_process(env), start_gateway_process(env)]
    try:
        for gw in gateways:
            gw.wait_ready()
        path = f"/client/v4/accounts/acc-l/ai/run/{DEFAULT_MODEL_ID}"
        headers = {"authorization": f"Bearer {secret}"}
        statuses = []
        for i in range(4):  # alternate: each process alone would allow all four
            response = httpx.post(
                gateways[i % 2].url + path, json={"prompt": "hi", "max_tokens": 1}, headers=headers, timeout=60
            )
            statuses.append(response.status_code)
        assert statuses == [200, 200, 200, 429]
        assert response.json()["errors"][0]["code"] == 3040
        assert 1 <= int(response.headers["retry-after"]) <= 120
    finally:
        for gw in gateways:
            gw.stop()


# ---- the window is on the store's clock: replicas with skewed clocks share one ------------------


class SkewedTime:
    """Stands in for the `time` module of gateway.pipeline.auth: the calling replica's clock, `offset_s` off."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def time(self) -> float:
        import time

        return time.time() + self.offset_s


async def test_two_replicas_with_skewed_clocks_share_one_window(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.settings import GatewaySettings
    from gateway.store.ledger import no_savings
    from gateway.store.redis import open_redis

    clock = SkewedTime()
    monkeypatch.setattr("gateway.pipeline.auth.time", clock, raising=False)  # the gateway's clock, if it reads one
    settings = GatewaySettings(redis_url=redis_url, key_prefix=redis_prefix)
    replicas = [open_redis(settings.store, no_savings, clock=clock.time) for _ in range(2)]  # and each replica's own
    try:
        await replicas[0].tenancy.create_tenant("Skew", ["acc-s"], tenant_id="ts")
        _, secret = await replicas[0].tenancy.create_key("ts", rpm=2, tpm=1000)
        auths = [Authenticator(r) for r in replicas]
        principal = await auths[0].authenticate(f"Bearer {secret}", "acc-s")
        clock.offset_s = +150.0  # replica 0 runs 2.5 minutes fast
        await admit(auths[0], principal, 100)
        await admit(auths[0], principal, 100)
        clock.offset_s = -150.0  # replica 1 as slow: on its own clock it would start a fresh window
        with pytest.raises(RateLimited):
            await admit(auths[1], principal, 100)
        await reconcile_tokens(replicas[1], principal.key.id, 100, 500)  # counted in the same window too
        clock.offset_s = +150.0
        with pytest.raises(RateLimited):
            await admit(auths[0], principal, 1)
    finally:
        for r in replicas:
            await r.aclose()
