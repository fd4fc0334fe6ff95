"""Backend KV events applied to the store's prefix index, checked against our hash chain."""

from __future__ import annotations

from contracts.prefix_hash import chain_hashes as engine_chain
from contracts.prefix_hash import salt_root
from gateway.fleet.kv_index import KVEventIndexer
from gateway.pipeline.tenant_salt import derive_cache_salt
from gateway.store import Store
from policies.prefix import block_hashes
from tests.gateway.store.calls import match_prefix

BLOCK = 4


def stored_event(event_id: int, parent: int | None, hashes: list[int], tokens: list[list[int]]) -> dict:
    blocks = [
        {"type": "stored_block", "block_hash": h, "tokens": [{"type": "unique_token", "token_id": t} for t in toks]}
        for h, toks in zip(hashes, tokens, strict=True)
    ]
    return {"event_id": event_id, "data": {"type": "stored", "parent_hash": parent, "blocks": blocks}}


def test_the_engine_hashes_like_the_gateway() -> None:
    tokens = list(range(100, 112))
    assert engine_chain(tokens, BLOCK, "tenant-a") == block_hashes(tokens, BLOCK, "tenant-a")


async def test_stored_chains_are_recorded_and_removals_applied(store: Store) -> None:
    tokens = list(range(100, 112))  # three full blocks
    hashes = engine_chain(tokens, BLOCK, "tenant-a")
    blocks = [tokens[i : i + BLOCK] for i in range(0, 12, BLOCK)]
    indexer = KVEventIndexer(store.routing, block_size=BLOCK)
    await indexer.apply("b1", [stored_event(0, salt_root("tenant-a"), hashes[:2], blocks[:2])])
    await indexer.apply("b1", [stored_event(1, hashes[1], hashes[2:], blocks[2:])])
    assert await match_prefix(store, hashes) == {"b1": 3, "b1@local": 3}  # in its pool (so reusable locally)
    await indexer.apply("b1", [{"event_id": 2, "data": {"type": "removed", "block_hashes": [hashes[2]]}}])
    assert await match_prefix(store, hashes) == {"b1": 2, "b1@local": 2}
    assert indexer.num_skipped == 0


async def test_hash_only_events_are_recorded_as_reported(store: Store) -> None:
    """Our backends send no token ids (they would reveal prompts): the hashes are taken as they are."""
    salt = derive_cache_salt(b"secret", "tenant-a")
    tokens = list(range(100, 112))
    hashes = engine_chain(tokens, BLOCK, salt)
    assert hashes == block_hashes(tokens, BLOCK, salt)  # the gateway's chain with the derived salt
    indexer = KVEventIndexer(store.routing, block_size=BLOCK)
    await indexer.apply("b1", [stored_event(0, salt_root(salt), hashes, [[], [], []])])
    assert await match_prefix(store, hashes) == {"b1": 3, "b1@local": 3}
    assert indexer.num_skipped == 0


async def test_foreign_hashes_and_wrong_block_sizes_are_skipped(store: Store) -> None:
    indexer = KVEventIndexer(store.routing, block_size=BLOCK)
    await indexer.apply("b1", [stored_event(0, 12345, [999, 1000], [[1, 2, 3, 4], [5, 6, 7, 8]])])  # another scheme
    good = engine_chain([1, 2, 3], 3, "t")
    await indexer.apply("b1", [stored_event(1, salt_root("t"), good, [[1, 2, 3]])])  # a 3-token block
    assert indexer.num_skipped == 2
    assert await match_prefix(store, [999]) == {} and await match_prefix(store, good) == {}
