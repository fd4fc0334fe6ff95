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

# The store's clock, in ms: every replica reads the same one (their own clocks may be skewed).
_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# policies.limits.window_key / previous_window_key / key_ttl_ms (sliding) for a scope at now_ms:
# -> previous counter, current counter, current counter's ttl_ms
_WINDOW_KEYS = """
local function window_keys(scope, now, w)
  local index = math.floor(now / w)
  local base = scope .. ':' .. int(w) .. ':'
  return base .. int(index - 1), base .. int(index), int((index + 2) * w - now)
end
"""

# No KEYS: the window counters are named here from the time, Redis's own (TIME) unless given.
# ARGV: now_ms ('' = Redis's clock), window_ms, rpm ('' = none), tpm ('' = none), tokens, rpm scope, tpm scope
# -> {rpm retry ms, tpm retry ms}; both 0 means allowed and counted.
CHECK_AND_CONSUME = _INT + _NOW_MS + _WINDOW_KEYS + SLIDING_WINDOW_LUA + """
local w = tonumber(ARGV[2])
local now = tonumber(ARGV[1]) or now_ms()
local rpm, tpm, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rpm_prev, rpm_cur, ttl = window_keys(ARGV[6], now, w)
local tpm_prev, tpm_cur = window_keys(ARGV[7], now, w)
local rpm_retry, tpm_retry = 0, 0
if rpm then rpm_retry = sliding_window(num(rpm_prev), num(rpm_cur), 1, rpm, w, now) end
if tpm then tpm_retry = sliding_window(num(tpm_prev), num(tpm_cur), cost, tpm, w, now) end
if rpm_retry ~= 0 or tpm_retry ~= 0 then return {rpm_retry, tpm_retry} end
if rpm then
  redis.call('INCR', rpm_cur)
  redis.call('PEXPIRE', rpm_cur, ttl)
end
if tpm and cost > 0 then
  redis.call('INCRBY', tpm_cur, ARGV[5])
  redis.call('PEXPIRE', tpm_cur, ttl)
end
return {0, 0}
"""

# No KEYS (as above); ARGV: actual - estimate, now_ms ('' = Redis's clock), window_ms, tpm scope
RECONCILE_TOKENS = _INT + _NOW_MS + _WINDOW_KEYS + """
local delta = tonumber(ARGV[1])
local prev, cur, ttl = window_keys(ARGV[4], tonumber(ARGV[2]) or now_ms(), tonumber(ARGV[3]))
if delta > 0 then
  redis.call('INCRBY', cur, ARGV[1])
  redis.call('PEXPIRE', cur, ttl)
  return
end
local take = math.min(num(cur), -delta)
if take > 0 then redis.call('DECRBY', cur, int(take)) end
local rest = math.min(num(prev), -delta - take)
if rest > 0 then redis.call('DECRBY', prev, int(rest)) end
"""

# KEYS: spend counter, this call's token key; ARGV: amount, budget ('' = unlimited), ttl_s, token ttl_s
# -> {allowed 0/1, spent}. The token key says what became of the call: absent (not here yet, or refused),
# the amount (applied), or 'undone' (UNDO_RESERVATIONS came first: a late arrival applies nothing). The
# same token sent twice applies once.
RESERVE_BUDGET = _INT + """
local spent = num(KEYS[1])
local token = redis.call('GET', KEYS[2])
if token == 'undone' then return {0, spent} end
if token then return {1, spent} end
local budget = tonumber(ARGV[2])
if budget and spent + tonumber(ARGV[1]) > budget then return {0, spent} end
spent = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[4])
return {1, spent}
"""

# KEYS: pairs (spend counter, token key) of reservations whose caller never learnt their fate; ARGV: token ttl_s.
# An applied one is taken back (never below 0, as SETTLE_BUDGET); each token ends 'undone', so one still on
# its way applies nothing, and a second run changes nothing. Runs when Redis is full too (allow-oom).
UNDO_RESERVATIONS = "#!lua flags=allow-oom\n" + """
for i = 1, #KEYS, 2 do
  local token = redis.call('GET', KEYS[i + 1])
  if token ~= 'undone' then
    if token and redis.call('EXISTS', KEYS[i]) == 1 then
      if redis.call('DECRBY', KEYS[i], token) < 0 then redis.call('SET', KEYS[i], '0', 'KEEPTTL') end
    end
    redis.call('SET', KEYS[i + 1], 'undone', 'EX', ARGV[1])
  end
end
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

# KEYS: a tenant's slot zset (request id -> lease end ms); ARGV: request id, limit, lease_ms -> 1 granted, 0 full
# Slots whose lease ran out (a crashed replica's) do not count. The first write is the ZADD, so a
# Redis at maxmemory refuses the script (a script that wrote once may go on writing past it).
ACQUIRE_SLOT = _INT + _NOW_MS + """
local now = now_ms()
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held and redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf') >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], int(now + tonumber(ARGV[3])), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: a tenant's slot zset; ARGV: lease_ms, then the request ids this replica still holds.
# Renewing adds nothing, so it runs when Redis is full too: running requests keep their slots.
RENEW_SLOTS = "#!lua flags=allow-oom\n" + _INT + _NOW_MS + """
local lease_end = int(now_ms() + tonumber(ARGV[1]))
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', lease_end, ARGV[i]) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
"""

# KEYS: idempotency key, ledger stream, time index, tenant's time index
# ARGV: "<ended_us:016d>:<request_id>", request_id, record JSON, idempotency ttl_ms -> 1 written, 0 duplicate
# A duplicate is one whose idempotency key is still there or, once it expired, whose record the time
# index still holds (members "<ended_us:016d>:<request_id>\0<stream id>"; older ones lack the \0 part).
APPEND_USAGE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 0 end
if #redis.call('ZRANGEBYLEX', KEYS[3], '[' .. ARGV[1] .. '\\0', '(' .. ARGV[1] .. '\\1', 'LIMIT', 0, 1) > 0 then
  return 0
end
local id = redis.call('XADD', KEYS[2], '*', 'request_id', ARGV[2], 'record', ARGV[3])
redis.call('SET', KEYS[1], id, 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], 0, ARGV[1] .. '\\0' .. id)
redis.call('ZADD', KEYS[4], 0, ARGV[1] .. '\\0' .. id)
return 1
"""

# Forget archived records (their idempotency keys stay until they expire, refusing late duplicates).
# Runs when Redis is full too (allow-oom): that is when it matters most.
# KEYS: stream, time index, watermark, then per record its tenant's time index
# ARGV: new watermark (us), then per record: index member, stream id ('' = unknown)
TRIM_LEDGER = """#!lua flags=allow-oom
for i = 1, (#ARGV - 1) / 2 do
  local member, id = ARGV[2 * i], ARGV[2 * i + 1]
  redis.call('ZREM', KEYS[2], member)
  redis.call('ZREM', KEYS[3 + i], member)
  if id ~= '' then redis.call('XDEL', KEYS[1], id) end
end
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[3]) or '0') then redis.call('SET', KEYS[3], ARGV[1]) end
"""

# KEYS: a lock; ARGV: its holder -> deleted if still held by it
RELEASE_LOCK = """#!lua flags=allow-oom
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
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
