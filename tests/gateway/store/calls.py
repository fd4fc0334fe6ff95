"""One store operation per call, as the tests ask for them, made of the concerns' own calls.

A request takes and gives back everything at once (`Admission.admit` / `settle`, `RoutingState.lookup`
/ `started`); these helpers ask for one part at a time, so each test checks one rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.store import Claim, Inflight, Release, RouteKey, Store

TENANT = "t-any"  # the tenant a key's window or a backend's counts are asked through (they ignore it)


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    allowed: bool
    spent_micro: int


async def reserve_budget(store: Store, tenant_id: str, month: str, amount_micro: int, budget_micro: int | None
                         ) -> BudgetDecision:
    claim = Claim(tenant_id, "reserve", month=month, amount_micro=amount_micro, budget_micro=budget_micro)
    admitted = await store.admission.admit(claim)
    return BudgetDecision(admitted.allowed, admitted.spent_micro)


async def settle_budget(store: Store, tenant_id: str, month: str, reserved_micro: int, actual_micro: int) -> int:
    release = Release(tenant_id, "settle", month=month, reserved_micro=reserved_micro, cost_micro=actual_micro)
    await store.admission.settle(release)
    return await store.admission.budget_spent(tenant_id, month)


async def acquire_request_slot(store: Store, tenant_id: str, request_id: str, limit: int) -> bool:
    return (await store.admission.admit(Claim(tenant_id, request_id, slot_limit=limit))).allowed


async def release_request_slot(store: Store, tenant_id: str, request_id: str) -> None:
    await store.admission.settle(Release(tenant_id, request_id, slot=True))


async def reconcile_tokens(store: Store, key_id: str, estimate: int, actual: int, now: float | None = None) -> None:
    release = Release(TENANT, "reconcile", key_id=key_id, tokens_counted=estimate, tokens_used=actual)
    await store.admission.settle(release, now=now)


async def add_inflight(store: Store, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
    await store.routing.add_inflight(Inflight(backend_id, prefill_tokens, decode_tokens))


async def release_inflight(store: Store, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
    await store.routing.release_inflight(Inflight(backend_id, prefill_tokens, decode_tokens))


async def match_prefix(store: Store, block_hashes: list[int]) -> dict[str, int]:
    return (await store.routing.lookup(RouteKey(block_hashes, TENANT))).matched


async def get_session(store: Store, tenant_id: str, session_id: str) -> str | None:
    return (await store.routing.lookup(RouteKey([], tenant_id, session_id))).previous_backend_id


async def set_session(store: Store, tenant_id: str, session_id: str, backend_id: str) -> None:
    await store.routing.started(backend_id, RouteKey([], tenant_id, session_id))
