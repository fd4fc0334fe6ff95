from __future__ import annotations

from policies.sim.conversations import derive_conversations


def derive(*requests: list[int], tenants: list[str] | None = None) -> list[int]:
    return derive_conversations(tenants or ["t"] * len(requests), list(requests))


def test_a_turn_extends_the_previous_one_whose_last_block_changed() -> None:
    # turn 2 repeats turn 1's full blocks [1, 2]; its partial block 3 became 4
    assert derive([1, 2, 3], [1, 2, 4, 5], [1, 2, 4, 5, 6, 7]) == [0, 0, 0]


def test_a_shared_first_block_does_not_join_conversations() -> None:
    # 0 is a system prompt every request starts with
    s = 0
    assert derive([s, 10, 11], [s, 20, 21], [s, 10, 11, 12], [s, 20, 22, 23], [s, 30]) == [0, 1, 0, 1, 2]


def test_the_same_trace_with_and_without_a_shared_first_block_splits_the_same() -> None:
    trace = [[1, 2, 3], [7, 8], [1, 2, 4, 5], [7, 8, 9], [1, 9]]
    assert derive(*trace) == derive(*[[100, *ids] for ids in trace])


def test_a_request_that_drops_more_than_the_last_block_starts_a_new_conversation() -> None:
    assert derive([1, 2, 3, 4], [1, 2, 9]) == [0, 1]


def test_tenants_never_share_a_conversation() -> None:
    assert derive([1, 2], [1, 2, 3], tenants=["a", "b"]) == [0, 1]
