"""Rate-limit window arithmetic, for the stores that keep the counters.

Time is integer milliseconds (`now_ms`), so no float drift. A rule allows `limit` units
(requests or tokens) per `window_ms`. The store keeps one counter per window, under
`window_key(scope, now_ms, window_ms)`, expiring after `key_ttl_ms`; this module only decides.

- Fixed window: windows are [i*W, (i+1)*W). A request of `cost` units is allowed when
  count + cost <= limit; otherwise it may retry when the next window opens.
- Sliding window (the two-counter approximation): the previous window's count is weighted by
  the share of it still inside the sliding window ending now:
      estimate = prev x (W - elapsed) / W + curr          (elapsed = now - current window start)
  and the request is allowed when estimate + cost <= limit. All of it is computed multiplied
  by W, in integers. Retry-after is the earliest time the same request would be allowed if
  nothing else arrived.
A request whose cost exceeds the limit can never be allowed: `retry_after_ms` is None.
Rejected requests must not be counted by the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.errors import LimitRuleError


@dataclass(slots=True, frozen=True)
class WindowRule:
    limit: int
    window_ms: int

    def __post_init__(self) -> None:
        if self.limit < 1 or self.window_ms < 1:
            raise LimitRuleError(f"rate limit {self.limit} per {self.window_ms} ms: both must be >= 1")


@dataclass(slots=True, frozen=True)
class Decision:
    allowed: bool
    remaining: int  # units left in the window after this request (0 when refused)
    retry_after_ms: int | None  # 0 when allowed; None when the request can never fit

    @property
    def retry_after_s(self) -> int | None:
        """Whole seconds for a Retry-After header (at least 1 when refused)."""
        if self.retry_after_ms is None:
            return None
        return 0 if self.allowed else max(1, -(-self.retry_after_ms // 1000))


def window_index(now_ms: int, window_ms: int) -> int:
    return now_ms // window_ms


def window_key(scope: str, now_ms: int, window_ms: int) -> str:
    """The counter key of the window holding `now_ms`, e.g. "tenant:acme:60000:28333"."""
    return f"{scope}:{window_ms}:{window_index(now_ms, window_ms)}"


def previous_window_key(scope: str, now_ms: int, window_ms: int) -> str:
    return f"{scope}:{window_ms}:{window_index(now_ms, window_ms) - 1}"


def key_ttl_ms(now_ms: int, window_ms: int, sliding: bool) -> int:
    """How long the current window's counter must live (a sliding window reads it one window more)."""
    end = (window_index(now_ms, window_ms) + (2 if sliding else 1)) * window_ms
    return end - now_ms


def fixed_window(count: int, cost: int, rule: WindowRule, now_ms: int) -> Decision:
    """`count` = units already counted in the current window."""
    _check(count, cost)
    if count + cost <= rule.limit:
        return Decision(True, rule.limit - count - cost, 0)
    if cost > rule.limit:
        return Decision(False, 0, None)
    return Decision(False, 0, rule.window_ms - now_ms % rule.window_ms)


def sliding_window(prev_count: int, count: int, cost: int, rule: WindowRule, now_ms: int) -> Decision:
    """`prev_count`, `count` = units counted in the previous and the current fixed window."""
    _check(prev_count, cost)
    _check(count, cost)
    limit, w = rule.limit, rule.window_ms
    elapsed = now_ms % w
    spare_x_w = limit * w - prev_count * (w - elapsed) - (count + cost) * w  # (limit - estimate - cost) x W
    if spare_x_w >= 0:
        return Decision(True, spare_x_w // w, 0)
    if cost > limit:
        return Decision(False, 0, None)
    if count + cost <= limit:  # fits later in this window, once enough of prev has slid out
        return Decision(False, 0, _elapsed_needed(prev_count, limit - count - cost, w) - elapsed)
    # Only after the window rolls: then prev = count and the new current window is empty.
    return Decision(False, 0, (w - elapsed) + _elapsed_needed(count, limit - cost, w))


def _elapsed_needed(prev: int, room: int, w: int) -> int:
    """Smallest elapsed e in [0, W] with prev x (W - e) <= room x W (prev > 0, room >= 0)."""
    return w - (room * w) // prev


def _check(count: int, cost: int) -> None:
    if count < 0 or cost < 0:
        raise LimitRuleError(f"counts and cost must be >= 0 (got count={count}, cost={cost})")
