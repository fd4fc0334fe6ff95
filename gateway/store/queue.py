"""The batch queue: Workers AI's asynchronous batch requests, kept until every item is answered.

A batch (`NewBatch`) is a tenant's list of item requests for one model, queued at once; each item
is then claimed by one gateway worker at a time under a lease (`claim`), renewed while it runs
(`renew`). A worker that dies leaves its item claimable again once the lease ends; one that finds no
spare capacity gives it back (`release`). The first `complete` of an item stores its answer and
wins; later ones (a worker whose lease had lapsed) change nothing. Once every item is answered the
batch's answers are kept `keep_s`, then dropped.

Bounded: a tenant's unanswered items, and the bytes of their requests, are capped at enqueue
(`max_queued`, `max_bytes`: atomically across replicas); answered batches expire. Durable: the
local queue is in the SQLite file, the Redis one in Redis (with its persistence), so queued work
survives a gateway restart.

Claim order is fair between tenants: claims go round the tenants with unanswered items in turn
(round-robin; a tenant whose items are all running or waiting is passed over, and goes to the back
like the one served), each claim looking at a bounded number of tenants (`TURNS_LOOKED_AT`);
within a tenant, first in, first out (a released item goes behind what is ready). So one tenant's
10,000-item batch does not hold back another tenant's later one. Ids are the
gateway's own (`batch_id`); an item's index is its place in the request, and answers come back in
that order.

An idle worker waits for work (`wait_for_work`) instead of claiming on a timer: an enqueue, or an
item given back to be claimed at once, wakes the waiting workers (the local queue: this process's,
by an in-process event; Redis: every replica's, by a pub/sub message). Nothing announces a lease that
lapses, an item given back for later, nor an enqueue by another process on a shared SQLite file: the
waiter's timeout (`batch_idle_poll_s`) covers those.

Implementations: `local.queue.LocalQueue` (the SQLite file) and `redis.queue.RedisQueue`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.store.checks import check_count, check_id, check_text

BatchStatus = Literal["queued", "running", "done"]
TURNS_LOOKED_AT = 16  # tenants one claim looks at, at most (bounded work per claim, in both stores)
EXPIRED_PER_CALL = 20  # answered batches one `expire` drops, at most (bounded work per call)


@dataclass(frozen=True, slots=True)
class NewBatch:
    batch_id: str
    tenant_id: str
    account_id: str  # the account in the URL it was queued on
    key_id: str  # the key that queued it: its items run (and are billed) as that key's requests
    model: str
    items: tuple[str, ...]  # each item's request body, as JSON text, in order

    def __post_init__(self) -> None:
        check_id("batch id", self.batch_id)
        check_id("tenant id", self.tenant_id)
        check_id("account id", self.account_id)
        check_id("key id", self.key_id)
        check_text("model", self.model)
        if not self.items or not all(isinstance(i, str) for i in self.items):
            raise ValueError("a batch needs one or more items, each a JSON text")


@dataclass(frozen=True, slots=True)
class ClaimedItem:
    """One item, held by the worker that claimed it until its lease ends."""

    batch_id: str
    index: int
    tenant_id: str
    account_id: str
    key_id: str
    model: str
    payload: str  # the item's request body (JSON text)
    token: str  # this claim's lease (renew and release check it)
    attempt: int  # claims so far, this one included (a lease that lapsed, a dead worker's, counts)
    released: int = 0  # claims given back unrun (`release`: no spare capacity then)

    @property
    def request_id(self) -> str:
        """The item's request id, its ledger record's key: the same when a dead worker's claim is run
        again (so it is billed once), another after each `release` (whose try may have left a
        no-cost record of a backend's refusal under its own id)."""
        base = f"{self.batch_id}.{self.index}"
        return base if self.released == 0 else f"{base}.r{self.released}"


@dataclass(frozen=True, slots=True)
class BatchState:
    batch_id: str
    model: str
    status: BatchStatus  # running: an item was claimed; done: every item answered
    results: tuple[str, ...]  # done: each item's answer (JSON text), in order; else empty


def check_lease(seconds: float) -> float:
    if not isinstance(seconds, int | float) or not 0 < seconds <= 86_400:
        raise ValueError(f"a lease must be between 0 and 86400 seconds, got {seconds!r}")
    return float(seconds)


def check_bounds(max_queued: int, max_bytes: int) -> None:
    check_count("max_queued", max_queued, positive=True)
    check_count("max_bytes", max_bytes, positive=True)


def payload_bytes(batch: NewBatch) -> int:
    return sum(len(item.encode()) for item in batch.items)


class BatchQueue(Protocol):
    async def enqueue(self, batch: NewBatch, max_queued: int, max_bytes: int) -> bool:
        """Queue every item, or none: False (nothing queued) when the tenant's unanswered items would
        pass `max_queued`, or their requests' UTF-8 bytes `max_bytes`. A batch id queued twice is an
        InvalidArgument."""
        ...

    async def claim(self, lease_s: float) -> ClaimedItem | None:
        """A ready item (never answered, not under a live lease), now leased for `lease_s`: the oldest of
        the tenant next in turn that has one (see the module's doc); None when there is none."""
        ...

    async def renew(self, item: ClaimedItem, lease_s: float) -> bool:
        """Extend the item's lease to `lease_s` from now; False when the claim is no longer the item's
        (its lease lapsed and another worker took it, or it was answered)."""
        ...

    async def release(self, item: ClaimedItem, retry_in_s: float) -> None:
        """Give an unanswered item back unrun, claimable again in `retry_in_s` (0: at once), counted in
        its `released`; nothing happens if the claim is no longer the item's."""
        ...

    async def complete(self, item: ClaimedItem, result: str, keep_s: float) -> bool:
        """Store the item's answer, unless it has one (False); the batch's last answer starts its
        `keep_s` of life."""
        ...

    async def state(self, tenant_id: str, batch_id: str) -> BatchState | None:
        """The tenant's batch; None when it does not exist, expired, or is another tenant's."""
        ...

    async def queued_items(self, tenant_id: str) -> tuple[int, int]:
        """The tenant's items not answered yet and their requests' bytes (what `enqueue` bounds)."""
        ...

    async def depth(self) -> tuple[int, int]:
        """Unanswered items of every tenant: (queued, running), running being those under a live lease.
        Cheap (counters, or a count over the leased items), for a metrics gauge every few seconds."""
        ...

    async def wait_for_work(self, timeout_s: float) -> None:
        """Return once an item may be ready to claim: one was enqueued or given back to be claimed at once
        (see the module's doc), or `timeout_s` passed. Never raises for the store being down (it waits
        the timeout: the next claim says so)."""
        ...

    async def expire(self) -> int:
        """Drop up to `EXPIRED_PER_CALL` batches answered more than their `keep_s` ago; how many (Redis
        expires keys itself: 0)."""
        ...
