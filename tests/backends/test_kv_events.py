from __future__ import annotations

from backends.server.kv_events import to_trtllm_json
from engines.base import KVCacheEvent


def test_stored_event_in_trtllm_shape() -> None:
    event = KVCacheEvent(event_id=7, kind="stored", block_hashes=[11, 12], parent_hash=10, token_ids=[[1, 2], [3, 4]])
    # with kv_events_include_tokens on; by default each block's "tokens" is [] (test_kv_feed.py)
    assert to_trtllm_json(event, window_size=8192, include_tokens=True) == {
        "event_id": 7,
        "window_size": 8192,
        "data": {
            "type": "stored",
            "parent_hash": 10,
            "blocks": [
                {"type": "stored_block", "block_hash": 11, "cache_level": 0, "priority": 35,
                 "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in (1, 2)]},
                {"type": "stored_block", "block_hash": 12, "cache_level": 0, "priority": 35,
                 "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in (3, 4)]},
            ],
            "medium": "GPU",  # the engine's own pool
        },
    }


def test_removed_event_in_trtllm_shape() -> None:
    event = KVCacheEvent(event_id=8, kind="removed", block_hashes=[11, 12])
    assert to_trtllm_json(event, window_size=4096) == {
        "event_id": 8, "window_size": 4096, "data": {"type": "removed", "block_hashes": [11, 12], "medium": "GPU"},
    }


def test_events_say_which_tier_the_blocks_are_in() -> None:
    moved = KVCacheEvent(event_id=9, kind="stored", block_hashes=[11], parent_hash=10, medium="CPU")
    data = to_trtllm_json(moved, window_size=4096)["data"]
    assert data["medium"] == "CPU" and data["blocks"][0]["cache_level"] == 1  # type: ignore[typeddict-item]
    shared = KVCacheEvent(event_id=10, kind="stored", block_hashes=[11], parent_hash=10, medium="REGION")
    assert to_trtllm_json(shared, window_size=4096)["data"]["blocks"][0]["cache_level"] == 2  # type: ignore[typeddict-item]
