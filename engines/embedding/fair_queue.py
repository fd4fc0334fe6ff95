"""Embedding requests waiting to be encoded: bounded, and served fairly between tenants.

Each request (`Job`) joins its tenant's FIFO. `take` builds the next forward pass by visiting the
tenants with work waiting in turn, one text each per visit, until the pass holds `budget_tokens`
(or `max_texts`); a tenant whose text did not fit keeps its turn for the next pass. So a big batch
is encoded a pass at a time, and another tenant's request joins the very next pass instead of
waiting for the whole batch (while more tenants wait than one pass holds texts, it joins one of
the next few, in turn).

The queue is bounded in input tokens not yet taken into a pass: all tenants together at most
`max_tokens`, one tenant at most `max_tenant_tokens`. Room is `reserve`d for a request before
its texts are tokenized, from an upper bound of their tokens, so a request that would go past
either bound is refused at once and costs no tokenizing (`EngineOverloaded`: the server answers
429, the caller retries later or elsewhere); `push` then puts the real count in its place. A
request larger than a tenant's whole bound can never fit (`InvalidRequest`: 400, split it). A
job whose caller has gone is `discard`ed: its texts not yet taken are dropped.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from engines.errors import EngineOverloaded, InvalidRequest


@dataclass(frozen=True, slots=True)
class QueueLimits:
    max_tokens: int  # tokens waiting over every tenant
    max_tenant_tokens: int  # tokens waiting for one tenant; also the most one request may carry
    budget_tokens: int  # tokens per forward pass (one text larger than this goes alone)
    max_texts: int = 256  # texts per forward pass

    def __post_init__(self) -> None:
        if min(self.max_tokens, self.max_tenant_tokens, self.budget_tokens, self.max_texts) < 1:
            raise ValueError("every embedding queue limit must be >= 1")


@dataclass(eq=False, slots=True)
class Job:
    """One request: its texts' token ids, and how far the queue has handed them out."""

    tenant: str
    ids: list[list[int]]
    num_taken: int = 0  # texts handed to passes so far (a prefix of `ids`)
    num_tokens: int = field(init=False)  # every text's tokens, [CLS] and [SEP] included

    def __post_init__(self) -> None:
        assert self.ids and all(self.ids), "a job has texts, and each text its [CLS] and [SEP] at least"
        self.num_tokens = sum(len(ids) for ids in self.ids)

    @property
    def num_waiting_tokens(self) -> int:
        return sum(len(ids) for ids in self.ids[self.num_taken :])


@dataclass(frozen=True, slots=True)
class Slice:
    """Texts `start:stop` of `job`, encoded in one pass."""

    job: Job
    start: int
    stop: int


class FairQueue:
    def __init__(self, limits: QueueLimits) -> None:
        self.limits = limits
        self.num_waiting_tokens = 0
        self._tenants: OrderedDict[str, deque[Job]] = OrderedDict()  # with work waiting, in turn order
        self._tenant_tokens: dict[str, int] = {}

    @property
    def num_tenants(self) -> int:
        return len(self._tenants)

    def tenant_tokens(self, tenant: str) -> int:
        return self._tenant_tokens.get(tenant, 0)

    def reserve(self, tenant: str, bound: int) -> int:
        """Hold room for a request not yet tokenized, `bound` tokens at most, or refuse it at once;
        returns what was held (`bound`, or the tenant's whole bound if larger: `push` then decides)."""
        held = min(bound, self.limits.max_tenant_tokens)
        self._check_room(tenant, held)
        self._count(tenant, held)
        return held

    def release(self, tenant: str, held: int) -> None:
        """Give back what `reserve` held for a request that will not be pushed."""
        self._count(tenant, -held)

    def push(self, job: Job, held: int = 0) -> None:
        """Queue `job` behind its tenant's earlier ones in place of the `held` tokens reserved for it,
        or refuse it (nothing changed: the caller still holds `held`)."""
        limits = self.limits
        if job.num_tokens > limits.max_tenant_tokens:
            raise InvalidRequest(
                f"the input is {job.num_tokens} tokens, more than one request may carry here "
                f"({limits.max_tenant_tokens}: the backend's embedding_tenant_max_queued_tokens); send fewer or "
                "shorter texts per request"
            )
        self._check_room(job.tenant, job.num_tokens - held)
        self._tenants.setdefault(job.tenant, deque()).append(job)
        self._count(job.tenant, job.num_tokens - held)

    def _check_room(self, tenant: str, more: int) -> None:
        if more <= 0:
            return
        limits, tenant_tokens = self.limits, self.tenant_tokens(tenant)
        if tenant_tokens + more > limits.max_tenant_tokens:
            raise EngineOverloaded(
                f"this tenant has {tenant_tokens} input tokens waiting to be encoded; {more} more would pass its "
                f"bound of {limits.max_tenant_tokens}: retry once its earlier requests are answered"
            )
        if self.num_waiting_tokens + more > limits.max_tokens:
            raise EngineOverloaded(
                f"{self.num_waiting_tokens} input tokens are waiting to be encoded; {more} more would pass the "
                f"queue's bound of {limits.max_tokens}: retry later or elsewhere"
            )

    def discard(self, job: Job) -> None:
        """Drop the texts of `job` not yet taken (its caller has gone)."""
        jobs = self._tenants.get(job.tenant)
        if jobs is None or job not in jobs:
            return
        jobs.remove(job)
        self._count(job.tenant, -job.num_waiting_tokens)
        job.num_taken = len(job.ids)
        if not jobs:
            del self._tenants[job.tenant]

    def take(self) -> list[Slice]:
        """The next pass: one text per tenant in turn while the pass has room; [] when nothing waits."""
        limits = self.limits
        taken: dict[Job, int] = {}  # job -> its first text in this pass
        num_tokens = num_texts = 0
        while self._tenants and num_texts < limits.max_texts:
            tenant, jobs = next(iter(self._tenants.items()))
            job = jobs[0]
            cost = len(job.ids[job.num_taken])
            if num_texts and num_tokens + cost > limits.budget_tokens:
                break  # this tenant's turn comes first in the next pass
            taken.setdefault(job, job.num_taken)
            job.num_taken += 1
            num_tokens, num_texts = num_tokens + cost, num_texts + 1
            self._count(tenant, -cost)
            if job.num_taken == len(job.ids):
                jobs.popleft()
            if jobs:
                self._tenants.move_to_end(tenant)
            else:
                del self._tenants[tenant]
        return [Slice(job, start, job.num_taken) for job, start in taken.items()]

    def _count(self, tenant: str, tokens: int) -> None:
        self.num_waiting_tokens += tokens
        left = self._tenant_tokens.get(tenant, 0) + tokens
        if left:
            self._tenant_tokens[tenant] = left
        else:
            self._tenant_tokens.pop(tenant, None)
