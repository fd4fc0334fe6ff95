"""A simulated backend: one FIFO prefill queue and per-request decoding, in simulated seconds.

Service model (deliberately simple, stated once):
- Prefill runs one request at a time in arrival order at `prefill_tokens_per_s`; only the
  uncached prompt tokens cost time (blocks in the pool are free). Blocks found in the host tier
  or the regional pool (tiers.py) are copied or fetched first, at their own rates, in the same
  queue; in-flight prefill tokens count that time in prefill-token units.
- Decoding starts when a request's prefill ends and produces `decode_tokens_per_s` tokens per
  second for that request, independently of the others (continuous batching, not slowed by
  batch size).
- Load = in-flight tokens: prompt tokens not yet prefilled (queued, or the unfinished share of
  the running prefill) and output tokens not yet generated, both linear in time.
- Time to first token = queueing + the request's own copies, fetches and prefill.
- `in_flight_token_seconds` integrates load over time (exactly: each request's tokens wait,
  then fall linearly), so dividing by the replay's length gives the average in-flight tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.sim.kv_cache import LRUBlockCache
from policies.sim.tiers import HOST_COPY_TOKENS_PER_S, REGION_FETCH_TOKENS_PER_S, TierHits, tier_hits


@dataclass(slots=True)
class _Running:
    prefill_start: float
    prefill_end: float
    decode_end: float
    num_prefill: float  # prefill-token units: computed tokens plus the copy or fetch time before them
    num_decode: int
    owner: int  # the gateway replica that sent it


@dataclass(slots=True)
class SimBackend:
    id: str
    cache: LRUBlockCache  # the KV pool; its `evict_to` is the host tier, if any
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    region: LRUBlockCache | None = None  # the regional pool, shared with the region's other backends
    host_copy_tokens_per_s: float = HOST_COPY_TOKENS_PER_S
    region_fetch_tokens_per_s: float = REGION_FETCH_TOKENS_PER_S
    prefill_free_at: float = 0.0
    running: list[_Running] = field(default_factory=list)
    num_requests: int = 0
    num_prefilled_tokens: int = 0  # uncached prompt tokens computed here
    num_decoded_tokens: int = 0
    peak_in_flight_tokens: int = 0
    in_flight_token_seconds: float = 0.0

    @property
    def work_tokens(self) -> int:
        return self.num_prefilled_tokens + self.num_decoded_tokens

    @property
    def host(self) -> LRUBlockCache | None:
        return self.cache.evict_to

    def lookup(self, block_hashes: tuple[int, ...]) -> TierHits:
        """Where this backend would find the request's leading blocks (no touch: looking is not using)."""
        return tier_hits(block_hashes, self.cache, self.host, self.region)

    def store(self, block_hashes: tuple[int, ...], hits: TierHits, now: float) -> None:
        """After `lookup`: every block enters the pool (what it evicts goes to the host tier);
        blocks fetched from the regional pool are used there and the prefilled ones put there."""
        self.cache.insert(block_hashes, now)
        if self.region is not None:
            self.region.insert(block_hashes[hits.pool + hits.host :], now)

    def fetch_seconds(self, num_host_tokens: int, num_region_tokens: int) -> float:
        """Time to copy tokens' blocks back from the host tier and fetch others from the region."""
        return num_host_tokens / self.host_copy_tokens_per_s + num_region_tokens / self.region_fetch_tokens_per_s

    def in_flight(self, now: float, owner: int | None = None) -> tuple[int, int]:
        """(prefill tokens, decode tokens) still to do at `now`, of one replica's requests if
        `owner` is given; forgets finished requests (so `now` must not go back in time)."""
        self.running = [r for r in self.running if r.decode_end > now]
        prefill = decode = 0.0
        for r in self.running:
            if owner is not None and r.owner != owner:
                continue
            if now < r.prefill_end:
                share = 1.0 if now <= r.prefill_start else (r.prefill_end - now) / (r.prefill_end - r.prefill_start)
                prefill += r.num_prefill * share
                decode += r.num_decode
            else:
                decode += r.num_decode * (r.decode_end - now) / (r.decode_end - r.prefill_end)
        return round(prefill), round(decode)

    def admit(self, now: float, num_prefill: int, num_decode: int, owner: int = 0, fetch_s: float = 0.0) -> float:
        """Queue a request (`fetch_s`: its copy and fetch time); returns its time to first token in seconds."""
        start = max(now, self.prefill_free_at)
        end = start + fetch_s + num_prefill / self.prefill_tokens_per_s
        decode_end = end + num_decode / self.decode_tokens_per_s
        load = num_prefill + fetch_s * self.prefill_tokens_per_s
        self.prefill_free_at = end
        self.running.append(_Running(start, end, decode_end, load, num_decode, owner))
        self.num_requests += 1
        self.num_prefilled_tokens += num_prefill
        self.num_decoded_tokens += num_decode
        # each kind of token: all of it waits, then it falls linearly to zero (a triangle)
        self.in_flight_token_seconds += load * ((start - now) + (end - start) / 2)
        self.in_flight_token_seconds += num_decode * ((end - now) + (decode_end - end) / 2)
        self.peak_in_flight_tokens = max(self.peak_in_flight_tokens, sum(self.in_flight(now)))
        return end - now

    def finish_time(self) -> float:
        """When the request admitted last ends its decode."""
        return self.running[-1].decode_end
