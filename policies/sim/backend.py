"""A simulated backend: one FIFO prefill queue and per-request decoding, in simulated seconds.

Service model (deliberately simple, stated once):
- Prefill runs one request at a time in arrival order at `prefill_tokens_per_s`; only the
  uncached prompt tokens cost time (cached blocks are free).
- Decoding starts when a request's prefill ends and produces `decode_tokens_per_s` tokens per
  second for that request, independently of the others (continuous batching, not slowed by
  batch size).
- Load = in-flight tokens: prompt tokens not yet prefilled (queued, or the unfinished share of
  the running prefill) and output tokens not yet generated, both linear in time.
- Time to first token = queueing + the request's own prefill.
- `in_flight_token_seconds` integrates load over time (exactly: each request's tokens wait,
  then fall linearly), so dividing by the replay's length gives the average in-flight tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.sim.kv_cache import LRUBlockCache


@dataclass(slots=True)
class _Running:
    prefill_start: float
    prefill_end: float
    decode_end: float
    num_prefill: int
    num_decode: int
    owner: int  # the gateway replica that sent it


@dataclass(slots=True)
class SimBackend:
    id: str
    cache: LRUBlockCache
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
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

    def admit(self, now: float, num_prefill: int, num_decode: int, owner: int = 0) -> float:
        """Queue a request; returns its time to first token in seconds."""
        start = max(now, self.prefill_free_at)
        end = start + num_prefill / self.prefill_tokens_per_s
        decode_end = end + num_decode / self.decode_tokens_per_s
        self.prefill_free_at = end
        self.running.append(_Running(start, end, decode_end, num_prefill, num_decode, owner))
        self.num_requests += 1
        self.num_prefilled_tokens += num_prefill
        self.num_decoded_tokens += num_decode
        # each kind of token: all of it waits, then it falls linearly to zero (a triangle)
        self.in_flight_token_seconds += num_prefill * ((start - now) + (end - start) / 2)
        self.in_flight_token_seconds += num_decode * ((end - now) + (decode_end - end) / 2)
        self.peak_in_flight_tokens = max(self.peak_in_flight_tokens, sum(self.in_flight(now)))
        return end - now

    def finish_time(self) -> float:
        """When the request admitted last ends its decode."""
        return self.running[-1].decode_end
