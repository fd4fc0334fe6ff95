"""Where a block lives, through the prefix index: events with a medium -> index keys -> a candidate's
pool, host-tier and regional-pool tokens -> the cache-aware policy's order."""

from __future__ import annotations

from typing import Any

from backends.client import Endpoint
from contracts.prefix_hash import chain_hashes
from gateway.fleet.kv_index import KVEventIndexer
from gateway.fleet.kv_tiers import tier_tokens
from gateway.pipeline.routing import candidate
from gateway.store import Store
from gateway.store.routing import RouteView
from policies.base import RouteInfo
from policies.cache_aware import CacheAware
from tests.gateway.store.calls import match_prefix

BLOCK = 4
TOKENS = list(range(100, 124))  # six full blocks
HASHES = chain_hashes(TOKENS, BLOCK, "t")


def event(kind: str, hashes: list[int], medium: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"type": kind}
    if kind == "stored":
        data |= {"parent_hash": None, "blocks": [{"type": "stored_block", "block_hash": h, "tokens": []} for h in hashes]}
    else:
        data["block_hashes"] = hashes
    if medium is not None:
        data["medium"] = medium
    return {"event_id": 0, "data": data}


async def test_events_move_blocks_between_the_tiers_keys(store: Store) -> None:
    indexer = KVEventIndexer(store.routing, BLOCK, {"b1": "eu", "b2": "eu"})
    await indexer.apply("b1", [event("stored", HASHES[:4])])  # computed: in b1's pool
    # the pool evicts blocks 2-3 into the host tier: removed from the pool, stored on the CPU
    await indexer.apply("b1", [event("removed", HASHES[2:4], "GPU"), event("stored", HASHES[2:4], "CPU")])
    await indexer.apply("b2", [event("stored", HASHES[:6], "REGION")])  # b2 shared the whole prompt with the region
    matched = await match_prefix(store, HASHES)
    assert matched == {"b1": 2, "b1@local": 4, "@region:eu": 6}
    assert tier_tokens(matched, "b1", "eu", BLOCK, len(TOKENS)) == (8, 8, 8)  # pool, then host tier, then region
    assert tier_tokens(matched, "b2", "eu", BLOCK, len(TOKENS)) == (0, 0, 24)  # b2 only reaches the region's
    assert tier_tokens(matched, "b3", "us", BLOCK, len(TOKENS)) == (0, 0, 0)  # another region's backend: a miss
    await indexer.apply("b1", [event("removed", HASHES[3:4], "CPU")])  # the host tier dropped one
    assert (await match_prefix(store, HASHES))["b1@local"] == 3


def test_the_policy_scores_own_pool_over_host_tier_over_region_over_miss() -> None:
    matched = {"pool": 6, "host@local": 6, "@region:eu": 6}
    view = RouteView(loads={}, matched=matched)
    endpoints = [Endpoint(id=i, base_url=f"http://{i}", region="eu") for i in ("pool", "host", "region")]
    endpoints.append(Endpoint(id="miss", base_url="http://miss", region="us"))
    candidates = [candidate(e, view, True, BLOCK, len(TOKENS)) for e in endpoints]
    assert [(c.cached_prefix_tokens, c.host_tier_tokens, c.region_pool_tokens) for c in candidates] == [
        (24, 0, 0), (0, 24, 0), (0, 0, 24), (0, 0, 0)]
    policy = CacheAware()
    info = RouteInfo(tenant="t", num_prompt_tokens=len(TOKENS), block_hashes=tuple(HASHES))
    scores = [policy.score_of(c, info) for c in candidates]
    assert scores == sorted(scores) and len(set(scores)) == 4  # strictly: pool < host tier < region < miss
    assert policy.select(candidates, info).id == "pool"  # type: ignore[union-attr]
