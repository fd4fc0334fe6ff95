"""The embedding queue's policy alone: passes shared between tenants in turn, bounds in tokens."""

from __future__ import annotations

import pytest

from engines.embedding.fair_queue import FairQueue, Job, QueueLimits
from engines.errors import EngineOverloaded, InvalidRequest


def job(tenant: str, *lengths: int) -> Job:
    return Job(tenant, [[0] * n for n in lengths])


def passes(queue: FairQueue) -> list[list[tuple[str, int, int]]]:
    """Every pass until the queue is empty, each as (tenant, start, stop) per slice."""
    found = []
    while slices := queue.take():
        found.append([(s.job.tenant, s.start, s.stop) for s in slices])
    return found


def test_another_tenants_request_joins_the_next_pass_not_the_end_of_a_big_batch() -> None:
    queue = FairQueue(QueueLimits(max_tokens=10_000, max_tenant_tokens=10_000, budget_tokens=1000))
    queue.push(job("a", *[256] * 12))  # three passes of 3 texts (768 tokens; a fourth would pass 1000)
    first = queue.take()
    assert [(s.job.tenant, s.start, s.stop) for s in first] == [("a", 0, 3)]
    queue.push(job("b", 4))
    assert passes(queue) == [[("a", 3, 6), ("b", 0, 1)], [("a", 6, 9)], [("a", 9, 12)]]
    assert queue.num_waiting_tokens == 0 and queue.num_tenants == 0


def test_tenants_take_turns_text_by_text_and_keep_their_order_across_passes() -> None:
    queue = FairQueue(QueueLimits(max_tokens=10_000, max_tenant_tokens=10_000, budget_tokens=30))
    queue.push(job("a", 10, 10, 10, 10))
    queue.push(job("b", 10, 10))
    queue.push(job("a", 10))  # behind a's first request
    assert passes(queue) == [
        [("a", 0, 2), ("b", 0, 1)],  # a, b, a
        [("b", 1, 2), ("a", 2, 4)],  # b's turn was next: b, a, a (b has no more)
        [("a", 0, 1)],
    ]


def test_one_text_larger_than_the_budget_goes_alone() -> None:
    queue = FairQueue(QueueLimits(max_tokens=10_000, max_tenant_tokens=10_000, budget_tokens=100))
    queue.push(job("a", 300, 5))
    assert passes(queue) == [[("a", 0, 1)], [("a", 1, 2)]]


def test_bounds_refuse_at_once_and_count_only_what_waits() -> None:
    queue = FairQueue(QueueLimits(max_tokens=250, max_tenant_tokens=150, budget_tokens=150))
    queue.push(job("a", 50, 50, 50))
    with pytest.raises(EngineOverloaded, match="this tenant has 150 input tokens waiting"):
        queue.push(job("a", 10))
    queue.push(job("b", 100))
    with pytest.raises(EngineOverloaded, match="250 input tokens are waiting"):
        queue.push(job("c", 10))
    assert queue.num_waiting_tokens == 250 and queue.tenant_tokens("a") == 150
    queue.take()  # a 50 + b 100 leave the queue: room again
    assert queue.num_waiting_tokens == 100 and queue.tenant_tokens("b") == 0
    queue.push(job("c", 10))
    queue.push(job("a", 50))
    with pytest.raises(InvalidRequest, match="more than one request may carry here \\(150"):
        queue.push(job("d", 100, 51))


def test_a_discarded_job_leaves_no_text_and_no_count_behind() -> None:
    queue = FairQueue(QueueLimits(max_tokens=1000, max_tenant_tokens=1000, budget_tokens=20))
    gone = job("a", 10, 10, 10, 10)
    queue.push(gone)
    queue.push(job("b", 10))
    queue.take()  # a's first text and b's
    queue.discard(gone)
    assert queue.take() == [] and queue.num_waiting_tokens == 0 and queue.tenant_tokens("a") == 0
    queue.discard(gone)  # twice is harmless
    assert queue.num_tenants == 0


def test_room_is_reserved_before_tokenizing_and_the_real_count_takes_its_place() -> None:
    queue = FairQueue(QueueLimits(max_tokens=1000, max_tenant_tokens=300, budget_tokens=100))
    held = queue.reserve("a", 250)  # an upper bound of the texts' tokens
    with pytest.raises(EngineOverloaded, match="this tenant has 250"):
        queue.reserve("a", 100)  # refused before its texts cost any tokenizing
    queue.push(job("a", 40, 40), held)
    assert queue.tenant_tokens("a") == 80 == queue.num_waiting_tokens
    held = queue.reserve("b", 5000)  # more than a tenant's bound: held at the bound, the real count decides
    assert held == 300
    with pytest.raises(InvalidRequest):
        queue.push(job("b", 301), held)
    queue.release("b", held)  # refused: the caller gives its reservation back
    assert queue.tenant_tokens("b") == 0 and queue.num_waiting_tokens == 80
