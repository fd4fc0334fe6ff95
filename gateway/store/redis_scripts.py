"""Lua scripts of the Redis store: each check-and-change is one script, so it is atomic.

Conventions: numbers arrive as ARGV strings and counts go back to Redis as ARGV strings or
through `int()` (Lua would print a large number as 1.2e+15). Scripts that walk other replicas'
counters or evict prefix entries build key names from a prefix passed in ARGV, so the store
needs one Redis (or a Cluster with a {hash tag} inside `key_prefix`).
"""

from __future__ import annotations

_INT = """
local function int(n) return string.format('%d', n) end
local function num(key) return tonumber(redis.call('GET', key) or '0') end
"""

# A port of policies.limits.sliding_window (tests compare the two on random inputs).
# Returns the retry in ms: 0 allowed, -1 never, > 0 wait.
SLIDING_WINDOW_LUA = """
local function floordiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function elapsed_needed(prev, room, w) return w - floordiv(room * w, prev) end
local function sliding_window(prev, count, cost, limit, w, now_ms)
  local elapsed = now_ms - floordiv(now_ms, w) * w
  local spare = limit * w - prev * (w - elapsed) - (count + cost) * w
  if spare >= 0 then return 0 end
  if cost > limit then return -1 end
  if count + cost <= limit then return elapsed_needed(prev, limit - count - cost, w) - elapsed end
  return (w - elapsed) + elapsed_needed(count, limit - cost, w)
end
"""

# KEYS: rpm previous, rpm current, tpm previous, tpm current window counters
# ARGV: now_ms, window_ms, rpm ('' = none), tpm ('' = none), tokens, counter ttl_ms
# -> {rpm retry ms, tpm retry ms}; both 0 means allowed and counted.
CHECK_AND_CONSUME = _INT + SLIDING_WINDOW_LUA + """
local now_ms, w = tonumber(ARGV[1]), tonumber(ARGV[2])
local rpm, tpm, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rpm_retry, tpm_retry = 0, 0
if rpm then rpm_retry = sliding_window(num(KEYS[1]), num(KEYS[2]), 1, rpm, w, now_ms) end
if tpm then tpm_retry = sliding_window(num(KEYS[3]), num(KEYS[4]), cost, tpm, w, now_ms) end
if rpm_retry ~= 0 or tpm_retry ~= 0 then return {rpm_retry, tpm_retry} end
if rpm then
  redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
end
if tpm and cost > 0 then
  redis.call('INCRBY', KEYS[4], ARGV[5])
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
end
return {0, 0}
"""

# KEYS: tpm previous, tpm current; ARGV: actual - estimate, counter ttl_ms
RECONCILE_TOKENS = _INT + """
local delta = tonumber(ARGV[1])
if delta > 0 then
  redis.call('INCRBY', KEYS[2], ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return
end
local take = math.min(num(KEYS[2]), -delta)
if take > 0 then redis.call('DECRBY', KEYS[2], int(take)) end
local rest = math.min(num(KEYS[1]), -delta - take)
if rest > 0 then redis.call('DECRBY', KEYS[1], int(rest)) end
"""

# KEYS: spend counter; ARGV: amount, budget ('' = unlimited), ttl_s -> {allowed 0/1, spent}
RESERVE_BUDGET = _INT + """
local spent = num(KEYS[1])
local budget = tonumber(ARGV[2])
if budget and spent + tonumber(ARGV[1]) > budget then return {0, spent} end
spent = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {1, spent}
"""

# KEYS: spend counter; ARGV: actual - reserved, ttl_s -> spent (never below 0)
SETTLE_BUDGET = """
local spent = redis.call('INCRBY', KEYS[1], ARGV[1])
if spent < 0 then
  redis.call('SET', KEYS[1], '0')
  spent = 0
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return spent
"""

# KEYS[1]: LRU zset (hash -> last recorded us); KEYS[2..n+1]: per-hash zsets (backend -> last recorded us)
# ARGV: backend, now_us, ttl_us, ttl_ms, max entries, per-hash key prefix, then the n hashes as strings.
# Block i of the chain is stamped now_us - i, so the leading blocks (worth the most: a match
# needs an unbroken run from the first block) are the most recent and evicted last. MATCH_PREFIX
# ignores holders not renewed within the TTL; they are deleted when a new holder joins the set.
RECORD_PREFIX = _INT + """
local backend, now_us = ARGV[1], tonumber(ARGV[2])
local stale = '(' .. int(now_us - tonumber(ARGV[3]))
local lru = {}
for i = 2, #KEYS do
  local stamp = int(now_us - (i - 2))
  if redis.call('ZADD', KEYS[i], stamp, backend) == 1 then  -- a new holder: drop the stale ones
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', stale)
  end
  redis.call('PEXPIRE', KEYS[i], ARGV[4])
  lru[#lru + 1] = stamp
  lru[#lru + 1] = ARGV[5 + i]
  if #lru >= 1000 or i == #KEYS then
    redis.call('ZADD', KEYS[1], unpack(lru))
    lru = {}
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', stale)  -- their keys expired on their own
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[5])
if excess > 0 then
  local victims = redis.call('ZPOPMIN', KEYS[1], excess)
  for j = 1, #victims, 2 do redis.call('DEL', ARGV[6] .. victims[j]) end
end
"""

# KEYS[1]: LRU zset; KEYS[2..]: per-hash zsets; ARGV: backend, then the hashes as strings
REMOVE_PREFIX = """
for i = 2, #KEYS do
  redis.call('ZREM', KEYS[i], ARGV[1])
  if redis.call('ZCARD', KEYS[i]) == 0 then
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
"""

# KEYS: per-hash zsets in chain order; ARGV: freshness bound '(us' -> {backend, leading blocks, ...}
MATCH_PREFIX = """
local alive, n_alive, matched = nil, 0, {}
for i = 1, #KEYS do
  local holders = redis.call('ZRANGEBYSCORE', KEYS[i], ARGV[1], '+inf')
  if alive == nil then
    alive = {}
    for _, b in ipairs(holders) do alive[b] = true; n_alive = n_alive + 1 end
  else
    local here = {}
    for _, b in ipairs(holders) do here[b] = true end
    for b in pairs(alive) do
      if not here[b] then matched[b] = i - 1; alive[b] = nil; n_alive = n_alive - 1 end
    end
  end
  if n_alive == 0 then break end
end
local out = {}
for b in pairs(alive or {}) do out[#out + 1] = b; out[#out + 1] = #KEYS end
for b, n in pairs(matched) do out[#out + 1] = b; out[#out + 1] = n end
return out
"""

# KEYS: this replica's prefill hash, decode hash, the replica registry set
# ARGV: backend, prefill delta, decode delta (signed), lease_ms, replica id
CHANGE_INFLIGHT = """
local function change(key, delta)
  if tonumber(delta) == 0 then return end
  if redis.call('HINCRBY', key, ARGV[1], delta) <= 0 then redis.call('HDEL', key, ARGV[1]) end
end
change(KEYS[1], ARGV[2])
change(KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('SADD', KEYS[3], ARGV[5])
"""

# Same KEYS; ARGV: backend, reported prefill, reported decode, lease_ms, replica id, inflight key prefix
# Sets this replica's share to report - (other live replicas' counts), at least 0.
CORRECT_INFLIGHT = _INT + """
local other_p, other_d = 0, 0
for _, r in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if r ~= ARGV[5] then
    other_p = other_p + tonumber(redis.call('HGET', ARGV[6] .. r .. ':prefill', ARGV[1]) or '0')
    other_d = other_d + tonumber(redis.call('HGET', ARGV[6] .. r .. ':decode', ARGV[1]) or '0')
  end
end
local function put(key, value)
  if value > 0 then redis.call('HSET', key, ARGV[1], int(value)) else redis.call('HDEL', key, ARGV[1]) end
  redis.call('PEXPIRE', key, ARGV[4])
end
put(KEYS[1], tonumber(ARGV[2]) - other_p)
put(KEYS[2], tonumber(ARGV[3]) - other_d)
redis.call('SADD', KEYS[3], ARGV[5])
"""

# KEYS: registry, a replica's prefill hash, decode hash; ARGV: replica id. Forget it if both are gone.
PRUNE_REPLICA = """
if redis.call('EXISTS', KEYS[2], KEYS[3]) == 0 then redis.call('SREM', KEYS[1], ARGV[1]) end
"""

# KEYS: idempotency key, ledger stream, time index, tenant's time index
# ARGV: index member ("<ended_us:016d>:<request_id>"), request_id, record JSON -> 1 written, 0 duplicate
APPEND_USAGE = """
if not redis.call('SET', KEYS[1], '', 'NX') then return 0 end
local id = redis.call('XADD', KEYS[2], '*', 'request_id', ARGV[2], 'record', ARGV[3])
redis.call('SET', KEYS[1], id)
redis.call('ZADD', KEYS[3], 0, ARGV[1])
redis.call('ZADD', KEYS[4], 0, ARGV[1])
return 1
"""

# KEYS: tenant hash, tenant set, then one key per account; ARGV: tenant id, then field/value pairs
# -> 0 created, -1 tenant id taken, i > 0 the i-th account is owned already
CREATE_TENANT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return i - 2 end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('SADD', KEYS[2], ARGV[1])
for i = 3, #KEYS do redis.call('SET', KEYS[i], ARGV[1]) end
return 0
"""
