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

# Counts a tokens-per-minute window up (delta > 0) or down: current window first, then the previous, never below 0.
_ADD_TO_WINDOW = """
local function add_to_window(scope, delta, now, w)
  local prev, cur, ttl = window_keys(scope, now, w)
  if delta > 0 then
    redis.call('INCRBY', cur, int(delta))
    redis.call('PEXPIRE', cur, ttl)
    return
  end
  local take = math.min(num(cur), -delta)
  if take > 0 then redis.call('DECRBY', cur, int(take)) end
  local rest = math.min(num(prev), -delta - take)
  if rest > 0 then redis.call('DECRBY', prev, int(rest)) end
end
"""

# In-flight tokens of this replica: KEYS[k], KEYS[k + 1] its prefill and decode hashes, KEYS[k + 2] the registry.
_CHANGE_INFLIGHT = """
local function change_inflight(k, backend, prefill, decode, lease_ms, replica)
  for i, delta in ipairs({prefill, decode}) do
    if delta ~= 0 and redis.call('HINCRBY', KEYS[k + i - 1], backend, int(delta)) <= 0 then
      redis.call('HDEL', KEYS[k + i - 1], backend)
    end
    redis.call('PEXPIRE', KEYS[k + i - 1], lease_ms)
  end
  redis.call('SADD', KEYS[k + 2], replica)
end
"""

# One request's admission (`Admission.admit`): checks first (reads only, so a Redis at maxmemory refuses the
# script at its first write, before anything is taken), then takes everything.
# KEYS: slot zset, spend counter, call token, this replica's prefill hash, decode hash, replica registry
# ARGV: [1] request id, [2] slot limit ('' = no slot), [3] lease_ms, [4] now_ms ('' = Redis's clock, for the window
#   only: slot leases are on Redis's clock), [5] window_ms, [6] tpm ('' = none), [7] tokens, [8] tpm scope,
#   [9] amount ('' = no reservation), [10] budget ('' = unlimited), [11] spend ttl_s, [12] token ttl_s,
#   [13] backend ('' = no in-flight tokens), [14] prefill, [15] decode, [16] replica id
# -> {0 admitted | 1 slot | 2 tpm | 3 budget, tpm retry ms, spent}. The token says what became of the call: absent
# (not here yet, or refused), the amount reserved (admitted), or 'undone' (UNDO_RESERVATIONS came first: a late
# arrival takes nothing). The same token sent twice takes once.
ADMIT = _INT + _NOW_MS + _WINDOW_KEYS + SLIDING_WINDOW_LUA + _CHANGE_INFLIGHT + """
local spent = num(KEYS[2])
local token = redis.call('GET', KEYS[3])
if token == 'undone' then return {3, 0, spent} end
if token then return {0, 0, spent} end
local clock = now_ms()
local slot_limit = tonumber(ARGV[2])
if slot_limit and not redis.call('ZSCORE', KEYS[1], ARGV[1])
    and redis.call('ZCOUNT', KEYS[1], '(' .. int(clock), '+inf') >= slot_limit then
  return {1, 0, spent}
end
local w, tpm = tonumber(ARGV[5]), tonumber(ARGV[6])
local now = tonumber(ARGV[4]) or clock
local tpm_prev, tpm_cur, ttl
if tpm then
  tpm_prev, tpm_cur, ttl = window_keys(ARGV[8], now, w)
  local retry = sliding_window(num(tpm_prev), num(tpm_cur), tonumber(ARGV[7]), tpm, w, now)
  if retry ~= 0 then return {2, retry, spent} end
end
local amount, budget = tonumber(ARGV[9]), tonumber(ARGV[10])
if amount and budget and spent + amount > budget then return {3, 0, spent} end
if slot_limit then
  redis.call('ZADD', KEYS[1], int(clock + tonumber(ARGV[3])), ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(clock))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
if tpm and tonumber(ARGV[7]) > 0 then
  redis.call('INCRBY', tpm_cur, ARGV[7])
  redis.call('PEXPIRE', tpm_cur, ttl)
end
if amount then
  spent = redis.call('INCRBY', KEYS[2], ARGV[9])
  redis.call('EXPIRE', KEYS[2], ARGV[11])
end
if ARGV[13] ~= '' then change_inflight(4, ARGV[13], tonumber(ARGV[14]), tonumber(ARGV[15]), ARGV[3], ARGV[16]) end
redis.call('SET', KEYS[3], ARGV[9] ~= '' and ARGV[9] or '0', 'EX', ARGV[12])
return {0, 0, spent}
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

# Appends a usage record once (the ledger, `redis/ledger.py`) and adds it to its hour's sums.
# KEYS[k..k+6]: idempotency key, stream, time index, tenant's time index, the hour's sums, the hour's latency
#   values, the index of summed hours
# ARGV[a..a+13]: "<ended_us:016d>:<request_id>", request_id, record JSON, idempotency ttl_ms, the record's group,
#   prompt, cached, completion tokens, cost, savings, "<hour>:<tenant>", hour, ttft µs ('' = none), itl µs ('' = none)
# -> 1 written, 0 duplicate. A duplicate is one whose idempotency key is still there or, once it expired, whose
# record the time index still holds (members "<ended_us:016d>:<request_id>\0<stream id>"; older ones lack the \0 part).
_APPEND_USAGE = """
local function append_usage(k, a)
  if redis.call('EXISTS', KEYS[k]) == 1 then return 0 end
  local member = ARGV[a]
  if redis.call('ZSCORE', KEYS[k + 2], member) then return 0 end
  if #redis.call('ZRANGEBYLEX', KEYS[k + 2], '[' .. member .. '\\0', '(' .. member .. '\\1', 'LIMIT', 0, 1) > 0 then
    return 0
  end
  local id = redis.call('XADD', KEYS[k + 1], '*', 'request_id', ARGV[a + 1], 'record', ARGV[a + 2])
  redis.call('SET', KEYS[k], id, 'PX', ARGV[a + 3])
  redis.call('ZADD', KEYS[k + 2], 0, member .. '\\0' .. id)
  redis.call('ZADD', KEYS[k + 3], 0, member .. '\\0' .. id)
  local group = ARGV[a + 4]
  redis.call('HINCRBY', KEYS[k + 4], group .. '\\30' .. '0', 1)
  for i = 1, 5 do
    if ARGV[a + 4 + i] ~= '0' then redis.call('HINCRBY', KEYS[k + 4], group .. '\\30' .. i, ARGV[a + 4 + i]) end
  end
  if ARGV[a + 12] ~= '' then redis.call('HINCRBY', KEYS[k + 5], 't' .. ARGV[a + 12], 1) end
  if ARGV[a + 13] ~= '' then redis.call('HINCRBY', KEYS[k + 5], 'i' .. ARGV[a + 13], 1) end
  redis.call('ZADD', KEYS[k + 6], ARGV[a + 11], ARGV[a + 10])
  return 1
end
"""

# KEYS and ARGV: the ledger's (above, from 1) -> 1 written, 0 duplicate
APPEND_USAGE = _APPEND_USAGE + "return append_usage(1, 1)"

# What one request gives back (`Admission.settle`), then its record. KEYS: slot zset, spend counter, this
# replica's prefill hash, decode hash, replica registry, then the ledger's 7 (with a record)
# ARGV: [1] request id, [2] '1' = free the slot, [3] tokens delta (0 = none), [4] now_ms ('' = Redis's clock),
#   [5] window_ms, [6] tpm scope, [7] spend delta ('' = none), [8] spend ttl_s, [9] backend ('' = none),
#   [10] prefill, [11] decode, [12] lease_ms, [13] replica id, then the ledger's 14 (with a record)
# -> 1 written, 0 duplicate, -1 no record
SETTLE = _INT + _NOW_MS + _WINDOW_KEYS + _ADD_TO_WINDOW + _CHANGE_INFLIGHT + _APPEND_USAGE + """
if ARGV[2] == '1' then redis.call('ZREM', KEYS[1], ARGV[1]) end
local delta = tonumber(ARGV[3])
if delta ~= 0 then add_to_window(ARGV[6], delta, tonumber(ARGV[4]) or now_ms(), tonumber(ARGV[5])) end
if ARGV[7] ~= '' then
  if redis.call('INCRBY', KEYS[2], ARGV[7]) < 0 then redis.call('SET', KEYS[2], '0') end
  redis.call('EXPIRE', KEYS[2], ARGV[8])
end
if ARGV[9] ~= '' then change_inflight(3, ARGV[9], -tonumber(ARGV[10]), -tonumber(ARGV[11]), ARGV[12], ARGV[13]) end
if #KEYS > 5 then return append_usage(6, 14) end
return -1
"""

# What is left to give back when SETTLE was refused for a full Redis: frees space, or changes counters in place.
# Same KEYS (the first 5) and ARGV (the first 13) as SETTLE.
RELEASE_WHEN_FULL = "#!lua flags=allow-oom\n" + _INT + _NOW_MS + _WINDOW_KEYS + _ADD_TO_WINDOW + _CHANGE_INFLIGHT + """
if ARGV[2] == '1' then redis.call('ZREM', KEYS[1], ARGV[1]) end
local delta = tonumber(ARGV[3])
if delta < 0 then add_to_window(ARGV[6], delta, tonumber(ARGV[4]) or now_ms(), tonumber(ARGV[5])) end
if ARGV[7] ~= '' and tonumber(ARGV[7]) < 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  if redis.call('INCRBY', KEYS[2], ARGV[7]) < 0 then redis.call('SET', KEYS[2], '0', 'KEEPTTL') end
end
if ARGV[9] ~= '' then change_inflight(3, ARGV[9], -tonumber(ARGV[10]), -tonumber(ARGV[11]), ARGV[12], ARGV[13]) end
"""

# Every backend's in-flight tokens, summed over the live replicas (a replica whose counts all expired is forgotten).
_LOADS = """
local function loads(registry, prefix)
  local totals, order = {}, {}
  for _, r in ipairs(redis.call('SMEMBERS', registry)) do
    local p_key, d_key = prefix .. r .. ':prefill', prefix .. r .. ':decode'
    local prefill, decode = redis.call('HGETALL', p_key), redis.call('HGETALL', d_key)
    if #prefill == 0 and #decode == 0 then
      if redis.call('EXISTS', p_key, d_key) == 0 then redis.call('SREM', registry, r) end
    end
    for column, counts in ipairs({prefill, decode}) do
      for j = 1, #counts, 2 do
        local b = counts[j]
        if not totals[b] then totals[b] = {0, 0}; order[#order + 1] = b end
        totals[b][column] = totals[b][column] + tonumber(counts[j + 1])
      end
    end
  end
  local out = {}
  for _, b in ipairs(order) do
    if totals[b][1] > 0 or totals[b][2] > 0 then
      out[#out + 1] = b; out[#out + 1] = int(totals[b][1]); out[#out + 1] = int(totals[b][2])
    end
  end
  return out
end
"""

# What routing reads for one request (`RoutingState.lookup`). KEYS: the replica registry, the session (read only
# when ARGV[3] is '1'), then the per-hash prefix zsets in chain order.
# ARGV: in-flight key prefix, freshness bound '(us', '1' = read the session
# -> {loads {backend, prefill, decode, ...}, the session's backend or false, matched {backend, leading blocks, ...}}
LOOKUP = _INT + _LOADS + """
local session = false
if ARGV[3] == '1' then session = redis.call('GET', KEYS[2]) end
local alive, n_alive, matched = nil, 0, {}
for i = 3, #KEYS do
  local holders = redis.call('ZRANGEBYSCORE', KEYS[i], ARGV[2], '+inf')
  if alive == nil then
    alive = {}
    for _, b in ipairs(holders) do alive[b] = true; n_alive = n_alive + 1 end
  else
    local here = {}
    for _, b in ipairs(holders) do here[b] = true end
    for b in pairs(alive) do
      if not here[b] then matched[b] = i - 3; alive[b] = nil; n_alive = n_alive - 1 end
    end
  end
  if n_alive == 0 then break end
end
local found = {}
for b in pairs(alive or {}) do found[#found + 1] = b; found[#found + 1] = #KEYS - 2 end
for b, n in pairs(matched) do found[#found + 1] = b; found[#found + 1] = n end
return {loads(KEYS[1], ARGV[1]), session, found}
"""

# The prefix index: KEYS[k] the LRU zset (hash -> last recorded µs), KEYS[k + 1 ..] per-hash zsets (backend ->
# last recorded µs); ARGV[a ..] the hashes as strings, in the same order as their keys. Block i of the chain is
# stamped now_us - i, so the leading blocks (worth the most: a match needs an unbroken run from the first block)
# are the most recent and evicted last. LOOKUP ignores holders not renewed within the TTL; they are deleted
# when a new holder joins the set.
_RECORD_PREFIX = """
local function record_prefix(k, a, backend, now_us, ttl_us, ttl_ms, max_entries, hash_prefix)
  local stale = '(' .. int(now_us - ttl_us)
  local lru = {}
  local n = #KEYS - k
  for i = 1, n do
    local stamp = int(now_us - (i - 1))
    if redis.call('ZADD', KEYS[k + i], stamp, backend) == 1 then  -- a new holder: drop the stale ones
      redis.call('ZREMRANGEBYSCORE', KEYS[k + i], '-inf', stale)
    end
    redis.call('PEXPIRE', KEYS[k + i], ttl_ms)
    lru[#lru + 1] = stamp
    lru[#lru + 1] = ARGV[a + i - 1]
    if #lru >= 1000 or i == n then
      redis.call('ZADD', KEYS[k], unpack(lru))
      lru = {}
    end
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', stale)  -- their keys expired on their own
  local excess = redis.call('ZCARD', KEYS[k]) - max_entries
  if excess > 0 then
    local victims = redis.call('ZPOPMIN', KEYS[k], excess)
    for j = 1, #victims, 2 do redis.call('DEL', hash_prefix .. victims[j]) end
  end
end
"""

# KEYS: the LRU zset, then the per-hash zsets; ARGV: backend, now_us, ttl_us, ttl_ms, max entries, per-hash key
# prefix, then the hashes
RECORD_PREFIX = _INT + _RECORD_PREFIX + """
record_prefix(1, 7, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), ARGV[6])
"""

# A request's backend answered (`RoutingState.started`). KEYS: session ('' unused), this replica's prefill hash,
# decode hash, the registry, the LRU zset, then the per-hash zsets (none: no prefix to record)
# ARGV: [1] backend, [2] session ttl_ms ('' = no session), [3] moved from backend ('' = nothing moved),
#   [4] moved prefill, [5] moved decode, [6] lease_ms, [7] replica id, [8] now_us, [9] ttl_us, [10] ttl_ms,
#   [11] max entries, [12] per-hash key prefix, then the hashes
STARTED = _INT + _CHANGE_INFLIGHT + _RECORD_PREFIX + """
if ARGV[3] ~= '' then
  local p, d = tonumber(ARGV[4]), tonumber(ARGV[5])
  change_inflight(2, ARGV[3], -p, -d, ARGV[6], ARGV[7])
  change_inflight(2, ARGV[1], p, d, ARGV[6], ARGV[7])
end
if #KEYS > 5 then
  record_prefix(5, 13, ARGV[1], tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11]), ARGV[12])
end
if ARGV[2] ~= '' then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
"""

# KEYS: this replica's prefill hash, decode hash, the registry; ARGV: backend, prefill delta, decode delta (signed),
# lease_ms, replica id
CHANGE_INFLIGHT = _INT + _CHANGE_INFLIGHT + """
change_inflight(1, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5])
"""

# KEYS: the replica registry; ARGV: in-flight key prefix -> {backend, prefill, decode, ...}
LOADS = _INT + _LOADS + """
return loads(KEYS[1], ARGV[1])
"""

# KEYS: a key found by its secret's hash; ARGV: the tenant key prefix -> {the key's fields, its tenant's fields}
AUTHENTICATE = """
local key = redis.call('HGETALL', KEYS[1])
if #key == 0 then return {{}, {}} end
local tenant_id
for i = 1, #key, 2 do if key[i] == 'tenant_id' then tenant_id = key[i + 1] end end
return {key, redis.call('HGETALL', ARGV[1] .. tenant_id)}
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

# KEYS: a tenant's slot zset; ARGV: lease_ms, then the request ids this replica still holds.
# Renewing adds nothing, so it runs when Redis is full too: running requests keep their slots.
RENEW_SLOTS = "#!lua flags=allow-oom\n" + _INT + _NOW_MS + """
local lease_end = int(now_ms() + tonumber(ARGV[1]))
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', lease_end, ARGV[i]) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
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
