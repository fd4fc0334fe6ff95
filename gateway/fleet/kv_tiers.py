"""Where a KV block lives, in the prefix index: one set of index keys per tier.

The store's prefix index (gateway/store/routing.py) answers one question per key: how many leading
blocks of a prompt's chain does it hold. Backends say where each block is (KV events' `medium`:
contracts/kv_events.py), and this module turns that into three keys the index already knows how to
answer for, without a new store operation:

    <backend>           the blocks in its own KV pool (what the index held before tiers)
    <backend>@local     those in its pool or in its host-memory tier: what it reuses without the network
    @region:<region>    those in the pool its region's backends share

so that a request's candidate gets `cached_prefix_tokens` from the first key, `host_tier_tokens`
from how far the second reaches past it, and `region_pool_tokens` from how far the third reaches
past both (`tier_tokens`), which the policies score as own pool > host tier > regional pool > miss.

A block moving down from the pool arrives as `removed` GPU then `stored` CPU: it leaves the pool's
key and stays under @local. The regional pool reports what backends put into it; Mooncake Store
evicts without telling, so its entries age out of the index with the index's TTL.
"""

from __future__ import annotations

from contracts.kv_events import MEDIUM_HOST, MEDIUM_POOL, MEDIUM_REGION


def local_key(backend_id: str) -> str:
    return f"{backend_id}@local"


def region_key(region: str) -> str:
    return f"@region:{region}"


def index_keys(backend_id: str, region: str, kind: str, medium: str | None) -> list[str]:
    """The index keys a `kind` ("stored" / "removed") event about blocks in `medium` changes."""
    medium = (medium or MEDIUM_POOL).upper()
    if medium == MEDIUM_POOL:
        return [backend_id, local_key(backend_id)]
    if medium == MEDIUM_HOST:
        return [local_key(backend_id)]
    if medium == MEDIUM_REGION:
        return [region_key(region)]
    return []  # a tier we do not score (a disk, another engine's name): left out


def tier_tokens(
    matched: dict[str, int], backend_id: str, region: str, block_size: int, num_prompt_tokens: int,
) -> tuple[int, int, int]:
    """(own pool, host tier, regional pool) tokens of the prompt's head, each run after the one before."""
    pool = matched.get(backend_id, 0)
    local = max(pool, matched.get(local_key(backend_id), 0))
    shared = max(local, matched.get(region_key(region), 0))

    def tokens(num_blocks: int) -> int:
        return min(num_prompt_tokens, num_blocks * block_size)

    return tokens(pool), tokens(local) - tokens(pool), tokens(shared) - tokens(local)
