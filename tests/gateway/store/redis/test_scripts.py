"""The Lua port of the sliding window must agree with policies.limits on every input."""

from __future__ import annotations

import random

import redis

from gateway.store.redis.scripts import SLIDING_WINDOW_LUA
from policies.limits import WindowRule, sliding_window

_PROBE = SLIDING_WINDOW_LUA + """
local out = {}
for i = 1, #ARGV, 6 do
  local a = {}
  for j = 0, 5 do a[j + 1] = tonumber(ARGV[i + j]) end
  out[#out + 1] = sliding_window(a[1], a[2], a[3], a[4], a[5], a[6])
end
return out
"""


def test_lua_sliding_window_matches_python(redis_url: str) -> None:
    rng = random.Random(7)
    cases = []
    for _ in range(3000):
        limit = rng.choice([1, 2, 3, 7, 20, 1000, 90_000, 10**7])
        window = rng.choice([1000, 60_000, 3_600_000])
        now_ms = rng.randrange(1_600_000_000_000, 1_900_000_000_000)
        if rng.random() < 0.2:
            now_ms -= now_ms % window  # exactly at a window's start
        prev = rng.randrange(0, 2 * limit + 1)
        count = rng.randrange(0, limit + 2)
        cost = rng.randrange(0, limit + 2)
        cases.append((prev, count, cost, limit, window, now_ms))
    with redis.Redis.from_url(redis_url) as client:
        got = client.eval(_PROBE, 0, *[x for case in cases for x in case])
    for case, lua in zip(cases, got):
        prev, count, cost, limit, window, now_ms = case
        expected = sliding_window(prev, count, cost, WindowRule(limit, window), now_ms).retry_after_ms
        assert lua == (-1 if expected is None else expected), case
