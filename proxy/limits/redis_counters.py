"""`RedisCounters`: the counters every replica shares, each call one atomic Lua script.

Layout (P is the prefix; every key of a bucket carries the bucket's key as its hash tag, so
they share a cluster slot):

- token bucket `P tb:{key}`: hash `level`, `ts` (floats as `%.17g`). A full bucket is deleted
  (it equals one never seen); otherwise it expires once it would be full again, plus a margin.
- slots `P sl:{key}`: sorted set, member request id, score its lease's deadline.
- budget bucket `P bg:{key}`: hash `base` and `asof` (the ledger figure and when it was read;
  no `asof` until a figure is given), `open`, `unl`, `ack` (running sums, integer nano-USD),
  `exp` (the window's `expires_at`), `o:<request id>` (an open reservation's amount),
  `u:<request id>` (settled, unacknowledged spend; removed, with its deadline, once
  acknowledged: request ids are unique and settled once, so nothing is kept to recognise a
  repeat) and `a:<second>` (spend acknowledged in that whole unix second). `P bg:{key}:dl` is
  a sorted set of the `o:…` and `u:…` entries scored by their deadline (an entry settled or
  acknowledged leaves it at once): lapsed ones are found with ZRANGEBYSCORE -inf now, so a
  check costs O(1) plus what lapsed. `P bg:{key}:ak` is a sorted set of the seconds that have an `a:…` field, scored by
  the second: every call forgets the seconds before the first one still counted (see
  `ACKED_KEEP_S`, `LEDGER_SKEW_S`), so `ack` is the sum of the rest and a check costs O(1) plus
  what it forgot. The keys expire with the window: from the first call that records its end.

Every script reads each hash it needs once (one HMGET), decides, then sets its fields with one
HSET (running sums written as computed, not incremented: the script is atomic), plus what
sorted sets, deleted fields and expiries need. The scripts are made of shared Lua functions,
one set per kind of counter: the single-purpose scripts and the composite `admit` and `finish`
call the same ones, so each rule is written once. `admit` checks everything before it writes
anything (a script runs atomically), so a refusal leaves nothing to give back.

Time is the caller's `now`, never Redis's clock, so tests drive it; expiries are set relative
to that `now` (`expires_at - now`, not EXPIREAT), which only matters when the two clocks
disagree, and a window past `expires_at` is also forgotten by the scripts themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio import Redis

from proxy.limits.counters import levels_of
from proxy.limits.store import (
    ACKED_KEEP_S,
    LEDGER_SKEW_S,
    Admission,
    Bucket,
    BudgetBucket,
    Levels,
    Reservation,
    Slots,
)

MARGIN_S = 60.0
"""How long past a token bucket's refill (or a slot's lease) its key outlives it."""

_LUA_COMMON = """
local MARGIN_S = 60
local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end
local function ms(seconds) return int(math.max(1, math.ceil(seconds * 1000))) end
"""

_LUA_TOKENS = """
-- Token buckets KEYS[k + i], i = 1..n, with capacity, per_second and cost from ARGV[a + 3i - 2]:
-- each read once and refilled to now.
local function tokens_read(k, a, n, now)
  local t = {}
  for i = 1, n do
    local key, at = KEYS[k + i], a + 3 * (i - 1)
    local capacity, rate = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    local state = redis.call('HMGET', key, 'level', 'ts')
    local level, ts = tonumber(state[1]), tonumber(state[2])
    if level == nil or ts == nil then
      level, ts = capacity, now
    else
      -- A replica whose clock is behind refills nothing rather than the same time twice.
      level, ts = math.min(capacity, level + math.max(0, now - ts) * rate), math.max(ts, now)
    end
    t[i] = {key = key, capacity = capacity, rate = rate, cost = tonumber(ARGV[at + 3]),
            level = level, ts = ts}
  end
  return t
end

-- `take`'s check: the first bucket short of its cost (0-based, -1 for none).
local function tokens_short(t)
  for i, b in ipairs(t) do
    if b.level < b.cost then return i - 1 end
  end
  return -1
end

local function tokens_take(t)
  for _, b in ipairs(t) do b.level = b.level - b.cost end
end

local function tokens_adjust(t)
  for _, b in ipairs(t) do b.level = math.min(b.capacity, b.level - b.cost) end
end

-- A bucket's final level as text, formatted once for both the hash and the reply.
local function level_text(b)
  if b.text == nil then b.text = num(b.level) end
  return b.text
end

-- Write each bucket's level: a full bucket equals one never seen, so it goes.
local function tokens_save(t, now, now_s)
  for _, b in ipairs(t) do
    if b.level >= b.capacity then
      redis.call('DEL', b.key)
    else
      local ts = now_s
      if b.ts ~= now then ts = num(b.ts) end
      redis.call('HSET', b.key, 'level', level_text(b), 'ts', ts)
      local refill_s = 86400
      if b.rate > 0 then refill_s = (b.capacity - b.level) / b.rate end
      redis.call('PEXPIRE', b.key, ms(refill_s + MARGIN_S))
    end
  end
end

-- `take`'s reply, appended to out: refused, then each bucket's level (the caller knows the
-- rest: when it is full again, when it holds its cost).
local function tokens_reply(t, refused, out)
  out[#out + 1] = refused
  for _, b in ipairs(t) do out[#out + 1] = level_text(b) end
  return out
end
"""

_LUA_SLOTS = """
-- Whether request_id holds, or may take, a slot of key; drops the leases that lapsed first.
local function slot_free(key, now_s, request_id, limit)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now_s)
  if redis.call('ZCARD', key) < limit then return true end
  return redis.call('ZSCORE', key, request_id) ~= false
end

-- Hold a slot until now + lease; one already held keeps its lease (NX).
local function slot_hold(key, now, request_id, lease)
  if redis.call('ZADD', key, 'NX', num(now + lease), request_id) == 1 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', key, ms(tonumber(last[2]) - now + MARGIN_S))
  end
end
"""

_LUA_BUDGETS = (
    f"local SKEW, KEEP = {LEDGER_SKEW_S!r}, {ACKED_KEEP_S!r}\n"
    + """
local CHUNK = 1000 -- fields per HMGET or HDEL: Lua's unpack takes only so many

local function get_fields(hash, fields)
  local values = {}
  for from = 1, #fields, CHUNK do
    local got = redis.call('HMGET', hash, unpack(fields, from, math.min(from + CHUNK - 1, #fields)))
    for j = 1, #got do values[from + j - 1] = got[j] end
  end
  return values
end

local function del_fields(hash, fields)
  for from = 1, #fields, CHUNK do
    redis.call('HDEL', hash, unpack(fields, from, math.min(from + CHUNK - 1, #fields)))
  end
end

local function del_members(zset, members)
  for from = 1, #members, CHUNK do
    redis.call('ZREM', zset, unpack(members, from, math.min(from + CHUNK - 1, #members)))
  end
end

-- A bucket's state, read with one HMGET (with the fields named in `mine`, into b.mine), its
-- window forgotten when it ended. What a script changes is kept in b and written by
-- budget_close: b.set (fields to set) and b.sums (open, unl and ack changed).
local function budget_read(hash, dl, ak, now, mine)
  local s = redis.call('HMGET', hash, 'exp', 'asof', 'base', 'open', 'unl', 'ack', unpack(mine))
  local exp = tonumber(s[1])
  if exp and exp <= now then
    redis.call('DEL', hash, dl, ak)
    s = {}
  end
  local b = {hash = hash, dl = dl, ak = ak, exp = s[1], asof = tonumber(s[2]),
             base = tonumber(s[3]) or 0, open = tonumber(s[4]) or 0, unl = tonumber(s[5]) or 0,
             ack = tonumber(s[6]), mine = {}, set = {}, sums = false, added = false}
  for j, field in ipairs(mine) do b.mine[field] = tonumber(s[6 + j]) end
  return b
end

-- Drop the entries (`o:` reservations, `u:` settled spend) whose deadline is past.
local function budget_lapse(b, now_s)
  local lapsed = redis.call('ZRANGEBYSCORE', b.dl, '-inf', now_s)
  if #lapsed == 0 then return end
  local amounts = get_fields(b.hash, lapsed)
  for j, entry in ipairs(lapsed) do
    local amount = tonumber(amounts[j]) or 0
    if string.sub(entry, 1, 2) == 'o:' then
      b.open = b.open - amount
    else
      b.unl = b.unl - amount
    end
    b.mine[entry] = nil
  end
  b.sums = true
  del_fields(b.hash, lapsed)
  redis.call('ZREMRANGEBYSCORE', b.dl, '-inf', now_s)
end

-- A bucket at now: lapsed, a newer ledger figure taken as the base, acknowledged spend the
-- figure covers (or older than KEEP) forgotten; b.level is its level.
local function budget_open(hash, dl, ak, now, now_s, ledger, as_of_s, mine)
  local b = budget_read(hash, dl, ak, now, mine)
  budget_lapse(b, now_s)
  local as_of = tonumber(as_of_s)
  if b.asof == nil or as_of > b.asof then
    b.base, b.asof = tonumber(ledger), as_of
    b.set.base, b.set.asof = ledger, as_of_s
  end
  -- No `ack` sum: nothing was ever acknowledged in this window, so no second to forget.
  if b.ack then
    local first = '(' .. int(math.max(math.floor(b.asof - SKEW), math.floor(now - KEEP)))
    local old = redis.call('ZRANGEBYSCORE', ak, '-inf', first)
    if #old > 0 then
      local fields = {}
      for j, second in ipairs(old) do fields[j] = 'a:' .. second end
      local amounts = get_fields(hash, fields)
      for j = 1, #fields do b.ack = b.ack - (tonumber(amounts[j]) or 0) end
      b.sums = true
      del_fields(hash, fields)
      redis.call('ZREMRANGEBYSCORE', ak, '-inf', first)
    end
  end
  b.level = b.base + b.open + b.unl + (b.ack or 0)
  return b
end

-- Write what changed with one HSET; the first time the window's end is seen, record it and
-- expire the keys with it (a deadlines set created since expires with the window too).
local function budget_close(b, now, expires_at)
  local args = {}
  for field, value in pairs(b.set) do
    args[#args + 1] = field
    args[#args + 1] = value
  end
  if b.sums then
    args[#args + 1] = 'open'
    args[#args + 1] = int(b.open)
    args[#args + 1] = 'unl'
    args[#args + 1] = int(b.unl)
    if b.ack then
      args[#args + 1] = 'ack'
      args[#args + 1] = int(b.ack)
    end
  end
  local ends = expires_at ~= nil and expires_at ~= ''
  local fresh = ends and b.exp ~= expires_at
  if fresh then
    args[#args + 1] = 'exp'
    args[#args + 1] = expires_at
  end
  if #args > 0 then redis.call('HSET', b.hash, unpack(args)) end
  if fresh then
    local ttl = ms(tonumber(expires_at) - now)
    redis.call('PEXPIRE', b.hash, ttl)
    redis.call('PEXPIRE', b.dl, ttl)
    redis.call('PEXPIRE', b.ak, ttl)
  elseif ends and b.added then
    redis.call('PEXPIRE', b.dl, ms(tonumber(expires_at) - now))
  end
end

-- Budget buckets i = 1..n: KEYS[k + 3i - 2 .. k + 3i] (hash, deadlines, acknowledged seconds)
-- and `per` arguments each, from ARGV[a + per * (i - 1) + 1]: ledger, ledger_as_of, expires_at
-- ('' for none), then the caller's own from ARGV[b.at + 1].
local function budgets_open(k, a, n, per, now, now_s, mine)
  local bs = {}
  for i = 1, n do
    local at, key = a + per * (i - 1), k + 3 * i
    local b = budget_open(KEYS[key - 2], KEYS[key - 1], KEYS[key], now, now_s, ARGV[at + 1],
                          ARGV[at + 2], mine)
    b.expires_at, b.at = ARGV[at + 3], at + 3
    bs[i] = b
  end
  return bs
end

local function budgets_close(bs, now)
  for _, b in ipairs(bs) do budget_close(b, now, b.expires_at) end
end

-- The request's fields in a bucket: its reservation and its settled spend.
local function request_fields(request_id)
  return {'o:' .. request_id, 'u:' .. request_id}
end
"""
)

_LUA_RESERVE = """
-- `reserve`'s rule over buckets with limit, blocking, group and amount: admitted (1/0), the
-- refusing bucket (0-based, -1 for none), the groups > 0 that can pay, the dropped ones.
local function budgets_decide(bs)
  local refusing = {}
  for i, b in ipairs(bs) do
    refusing[i] = b.blocking and b.level + b.amount > b.limit
    if b.group == 0 and refusing[i] then return 0, i - 1, {}, {} end
  end
  local given, dropped, last = {}, {}, 0
  for i, b in ipairs(bs) do
    if b.group > 0 then
      given[b.group] = true
      last = math.max(last, b.group)
      if refusing[i] then dropped[b.group] = true end
    end
  end
  local survivors = {}
  for g in pairs(given) do
    if not dropped[g] then survivors[#survivors + 1] = g end
  end
  if last > 0 and #survivors == 0 then
    for i, b in ipairs(bs) do
      if b.group == last and refusing[i] then return 0, i - 1, {}, {} end
    end
  end
  return 1, -1, survivors, dropped
end

-- Reserve each opened bucket's amount (its own arguments: limit, blocking (1/0), group,
-- amount) for the request owning `mine`, until deadline_s; appends admitted, refused, the
-- number of groups, the groups and the levels to out; whether admitted.
local function budgets_reserve(bs, mine, deadline_s, out)
  local again = false
  for _, b in ipairs(bs) do
    b.limit, b.blocking = tonumber(ARGV[b.at + 1]), ARGV[b.at + 2] == '1'
    b.group, b.amount_s = tonumber(ARGV[b.at + 3]), ARGV[b.at + 4]
    b.amount = tonumber(b.amount_s)
    b.held = b.mine[mine[1]] ~= nil or b.mine[mine[2]] ~= nil
    if b.held then again = true end
  end
  local admitted, refused, groups = 1, -1, {}
  if again then
    -- A repeat (say, a retry after a timeout): report what the first call did.
    local seen = {}
    for _, b in ipairs(bs) do
      if b.held and b.group > 0 and not seen[b.group] then
        seen[b.group] = true
        groups[#groups + 1] = b.group
      end
    end
  else
    local dropped
    admitted, refused, groups, dropped = budgets_decide(bs)
    if admitted == 1 then
      for _, b in ipairs(bs) do
        if b.group == 0 or not dropped[b.group] then
          b.set[mine[1]] = b.amount_s
          b.open, b.sums = b.open + b.amount, true
          redis.call('ZADD', b.dl, deadline_s, mine[1])
          b.added = true
          b.level = b.level + b.amount
        end
      end
    end
  end
  out[#out + 1] = admitted
  out[#out + 1] = refused
  out[#out + 1] = #groups
  for _, g in ipairs(groups) do out[#out + 1] = g end
  for _, b in ipairs(bs) do out[#out + 1] = b.level end
  return admitted == 1
end
"""

_LUA_SETTLE = """
-- End the request's reservation in an opened bucket: its cost (its own argument) becomes
-- unacknowledged spend until deadline_s (none when 0). Settled already: nothing.
local function budget_settle(b, mine, deadline_s)
  if b.mine[mine[2]] ~= nil then return end
  local reserved = b.mine[mine[1]]
  if reserved ~= nil then
    b.open, b.sums = b.open - reserved, true
    redis.call('HDEL', b.hash, mine[1])
    redis.call('ZREM', b.dl, mine[1])
  end
  local cost_s = ARGV[b.at + 1]
  local cost = tonumber(cost_s)
  if cost ~= 0 then
    b.set[mine[2]] = cost_s
    b.unl, b.sums = b.unl + cost, true
    redis.call('ZADD', b.dl, deadline_s, mine[2])
    b.added = true
  end
end
"""

_TAKE = (
    _LUA_COMMON
    + _LUA_TOKENS
    + """
-- KEYS: one hash per bucket. ARGV: now, then capacity, per_second, cost per bucket.
local now = tonumber(ARGV[1])
local t = tokens_read(0, 1, #KEYS, now)
local refused = tokens_short(t)
if refused < 0 then
  tokens_take(t)
  tokens_save(t, now, ARGV[1])
end
return tokens_reply(t, refused, {})
"""
)

_ADJUST = (
    _LUA_COMMON
    + _LUA_TOKENS
    + """
-- KEYS: one hash per bucket. ARGV: now, then capacity, per_second, cost per bucket.
local now = tonumber(ARGV[1])
local t = tokens_read(0, 1, #KEYS, now)
tokens_adjust(t)
tokens_save(t, now, ARGV[1])
"""
)

_ACQUIRE = (
    _LUA_COMMON
    + _LUA_SLOTS
    + """
-- KEYS: the slots' sorted set. ARGV: now, request id, limit, lease_s.
if not slot_free(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])) then return 0 end
slot_hold(KEYS[1], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[4]))
return 1
"""
)

_RESERVE = (
    _LUA_COMMON
    + _LUA_BUDGETS
    + _LUA_RESERVE
    + """
-- KEYS: hash, deadlines, acknowledged seconds per bucket. ARGV: request id, now, lease_s, then
-- per bucket ledger, ledger_as_of, expires_at, limit, blocking, group, amount.
local mine, now_s, lease = request_fields(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local now = tonumber(now_s)
local bs = budgets_open(0, 3, #KEYS / 3, 7, now, now_s, mine)
local out = {}
budgets_reserve(bs, mine, num(now + lease), out)
budgets_close(bs, now)
return out
"""
)

_SETTLE = (
    _LUA_COMMON
    + _LUA_BUDGETS
    + _LUA_SETTLE
    + """
-- KEYS: hash, deadlines, acknowledged seconds per bucket. ARGV: request id, now, hold_s, then
-- per bucket ledger, ledger_as_of, expires_at, cost.
local mine, now_s, hold = request_fields(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local now = tonumber(now_s)
local bs = budgets_open(0, 3, #KEYS / 3, 4, now, now_s, mine)
local deadline = num(now + hold)
for _, b in ipairs(bs) do budget_settle(b, mine, deadline) end
budgets_close(bs, now)
"""
)

_ADMIT = (
    _LUA_COMMON
    + _LUA_TOKENS
    + _LUA_SLOTS
    + _LUA_BUDGETS
    + _LUA_RESERVE
    + """
-- KEYS: a hash per token bucket, a sorted set per slots, then hash, deadlines, acknowledged
-- seconds per budget. ARGV: now, request id, lease_s, the numbers of buckets and of slots,
-- then capacity, per_second, cost per bucket; limit, lease_s per slots; ledger, ledger_as_of,
-- expires_at, limit, blocking, group, amount per budget. Everything is checked before anything
-- is written. Reply: `take`'s (if buckets were given; the end when refused), the refusing
-- slots (-1 for none; the end when refused), then `reserve`'s (if budgets were given).
local now_s, request_id, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, nt, ns = tonumber(now_s), tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {}
local t = tokens_read(0, 5, nt, now)
if nt > 0 then
  local refused = tokens_short(t)
  if refused < 0 then tokens_take(t) end
  tokens_reply(t, refused, out)
  if refused >= 0 then return out end
end
local slots_at = 5 + 3 * nt
for i = 1, ns do
  if not slot_free(KEYS[nt + i], now_s, request_id, tonumber(ARGV[slots_at + 2 * i - 1])) then
    out[#out + 1] = i - 1
    return out
  end
end
out[#out + 1] = -1
local nb = (#KEYS - nt - ns) / 3
if nb > 0 then
  local mine = request_fields(request_id)
  local bs = budgets_open(nt + ns, slots_at + 2 * ns, nb, 7, now, now_s, mine)
  local admitted = budgets_reserve(bs, mine, num(now + lease), out)
  budgets_close(bs, now)
  if not admitted then return out end
end
tokens_save(t, now, now_s)
for i = 1, ns do
  slot_hold(KEYS[nt + i], now, request_id, tonumber(ARGV[slots_at + 2 * i]))
end
return out
"""
)

_FINISH = (
    _LUA_COMMON
    + _LUA_TOKENS
    + _LUA_BUDGETS
    + _LUA_SETTLE
    + """
-- KEYS: a hash per token bucket to adjust, a sorted set per slots to release, then hash,
-- deadlines, acknowledged seconds per budget. ARGV: now, request id, hold_s, the numbers of
-- buckets and of slots, then capacity, per_second, cost per bucket; ledger, ledger_as_of,
-- expires_at, cost per budget.
local now_s, request_id, hold = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, nt, ns = tonumber(now_s), tonumber(ARGV[4]), tonumber(ARGV[5])
local t = tokens_read(0, 5, nt, now)
tokens_adjust(t)
tokens_save(t, now, now_s)
for i = 1, ns do redis.call('ZREM', KEYS[nt + i], request_id) end
local nb = (#KEYS - nt - ns) / 3
if nb > 0 then
  local mine = request_fields(request_id)
  local bs = budgets_open(nt + ns, 5 + 3 * nt, nb, 4, now, now_s, mine)
  local deadline = num(now + hold)
  for _, b in ipairs(bs) do budget_settle(b, mine, deadline) end
  budgets_close(bs, now)
end
"""
)

_LEDGERED = (
    _LUA_COMMON
    + _LUA_BUDGETS
    + """
-- KEYS: hash, deadlines, acknowledged seconds per bucket. ARGV: now, then per bucket the
-- number of its request ids and those ids.
local now_s = ARGV[1]
local now = tonumber(now_s)
local second = int(math.floor(now))
local at = 2
for i = 1, #KEYS / 3 do
  local b = budget_read(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], now, {})
  budget_lapse(b, now_s)
  local fields, done, moved = {}, {}, 0
  for j = 1, tonumber(ARGV[at]) do fields[j] = 'u:' .. ARGV[at + j] end
  at = at + 1 + #fields
  local amounts = get_fields(b.hash, fields)
  local gone = {}
  for j, field in ipairs(fields) do
    local amount = tonumber(amounts[j])
    if amount and not done[field] then
      done[field] = true
      moved = moved + amount
      gone[#gone + 1] = field
    end
  end
  if #gone > 0 then
    -- Acknowledged: the entry and its deadline go (a repeat then finds nothing).
    del_fields(b.hash, gone)
    del_members(b.dl, gone)
  end
  if moved ~= 0 then
    b.unl, b.ack, b.sums = b.unl - moved, (b.ack or 0) + moved, true
    redis.call('HINCRBY', b.hash, 'a:' .. second, int(moved))
    redis.call('ZADD', b.ak, second, second)
    local ttl = redis.call('PTTL', b.hash)
    if ttl > 0 then redis.call('PEXPIRE', b.ak, ttl) end
  end
  budget_close(b, now, nil)
end
"""
)


class RedisCounters:
    """`Counters` shared by every replica through one Redis. Owns `client`: `close` closes it.

    Give the client short timeouts and no retries of its own: `FallbackCounters` decides what
    happens when Redis does not answer.
    """

    def __init__(self, client: Redis, prefix: str = "vkgate:") -> None:
        self._client = client
        self._tokens_prefix = f"{prefix}tb:{{"
        self._slots_prefix = f"{prefix}sl:{{"
        self._budget_prefix = f"{prefix}bg:{{"
        self._take = client.register_script(_TAKE)
        self._adjust = client.register_script(_ADJUST)
        self._acquire = client.register_script(_ACQUIRE)
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        self._ledgered = client.register_script(_LEDGERED)
        self._admit = client.register_script(_ADMIT)
        self._finish = client.register_script(_FINISH)

    async def admit(
        self,
        request_id: str,
        buckets: Sequence[Bucket],
        slots: Sequence[Slots],
        budgets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Admission:
        if not (buckets or slots or budgets):
            return Admission(None)
        keys = self._token_keys(buckets)
        keys += [self._slots_prefix + s.key + "}" for s in slots]
        self._add_budget_keys(keys, [b.key for b in budgets])
        args: list[Any] = [now, request_id, lease_s, len(buckets), len(slots)]
        _add_token_args(args, buckets)
        for s in slots:
            args += (s.limit, s.lease_s)
        _add_reserve_args(args, budgets, amounts)
        reply = await self._admit(keys=keys, args=args)
        at = 0
        levels = None
        if buckets:
            levels = _levels(reply, buckets)
            if not levels.admitted:
                return Admission(levels)
            at = 1 + len(buckets)
        slots_refused = int(reply[at])
        if slots_refused >= 0:
            return Admission(levels, slots_refused=slots_refused)
        reservation = _reservation(reply, at + 1, len(budgets)) if budgets else None
        return Admission(levels, reservation=reservation)

    async def finish(
        self,
        request_id: str,
        adjust: Sequence[Bucket],
        slots: Sequence[Slots],
        budgets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        if not (adjust or slots or budgets):
            return
        keys = self._token_keys(adjust)
        keys += [self._slots_prefix + s.key + "}" for s in slots]
        self._add_budget_keys(keys, [b.key for b in budgets])
        args: list[Any] = [now, request_id, hold_s, len(adjust), len(slots)]
        _add_token_args(args, adjust)
        _add_settle_args(args, budgets, costs)
        await self._finish(keys=keys, args=args)

    async def take(self, buckets: Sequence[Bucket], now: float) -> Levels:
        args: list[Any] = [now]
        _add_token_args(args, buckets)
        return _levels(await self._take(keys=self._token_keys(buckets), args=args), buckets)

    async def adjust(self, buckets: Sequence[Bucket], now: float) -> None:
        if not buckets:
            return
        args: list[Any] = [now]
        _add_token_args(args, buckets)
        await self._adjust(keys=self._token_keys(buckets), args=args)

    async def acquire(self, slots: Slots, request_id: str, now: float) -> bool:
        held = await self._acquire(
            keys=[self._slots_prefix + slots.key + "}"],
            args=[now, request_id, slots.limit, slots.lease_s],
        )
        return int(held) == 1

    async def release(self, slots: Slots, request_id: str) -> None:
        # One command is atomic on its own: no script needed.
        await self._client.zrem(self._slots_prefix + slots.key + "}", request_id)

    async def reserve(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Reservation:
        keys: list[str] = []
        self._add_budget_keys(keys, [b.key for b in buckets])
        args: list[Any] = [request_id, now, lease_s]
        _add_reserve_args(args, buckets, amounts)
        return _reservation(await self._reserve(keys=keys, args=args), 0, len(buckets))

    async def settle(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        if not buckets:
            return
        keys: list[str] = []
        self._add_budget_keys(keys, [b.key for b in buckets])
        args: list[Any] = [request_id, now, hold_s]
        _add_settle_args(args, buckets, costs)
        await self._settle(keys=keys, args=args)

    async def ledgered(self, entries: Sequence[tuple[str, str]], now: float) -> None:
        if not entries:
            return
        by_bucket: dict[str, list[str]] = {}
        for key, request_id in entries:
            by_bucket.setdefault(key, []).append(request_id)
        keys: list[str] = []
        self._add_budget_keys(keys, by_bucket)
        args: list[Any] = [now]
        for request_ids in by_bucket.values():
            args += [len(request_ids), *request_ids]
        await self._ledgered(keys=keys, args=args)

    async def close(self) -> None:
        await self._client.aclose()

    def _token_keys(self, buckets: Sequence[Bucket]) -> list[str]:
        prefix = self._tokens_prefix
        return [prefix + b.key + "}" for b in buckets]

    def _add_budget_keys(self, keys: list[str], names: Iterable[str]) -> None:
        for name in names:
            hash_key = self._budget_prefix + name + "}"
            keys += (hash_key, hash_key + ":dl", hash_key + ":ak")


# Arguments go to redis-py as they are: it encodes ints and floats itself (`repr`), exactly as
# the scripts read them back with `tonumber`.


def _add_token_args(args: list[Any], buckets: Sequence[Bucket]) -> None:
    for b in buckets:
        args += (b.capacity, b.per_second, b.cost)


def _add_reserve_args(
    args: list[Any], buckets: Sequence[BudgetBucket], amounts: Sequence[int]
) -> None:
    for b, amount in zip(buckets, amounts, strict=True):
        args += (
            b.ledger_nanos,
            b.ledger_as_of,
            "" if b.expires_at is None else b.expires_at,
            b.limit_nanos,
            1 if b.blocking else 0,
            b.group,
            amount,
        )


def _add_settle_args(
    args: list[Any], buckets: Sequence[BudgetBucket], costs: Sequence[int]
) -> None:
    for b, cost in zip(buckets, costs, strict=True):
        args += (b.ledger_nanos, b.ledger_as_of, "" if b.expires_at is None else b.expires_at, cost)


def _levels(reply: list[Any], buckets: Sequence[Bucket]) -> Levels:
    """`take`'s reply: refused, then the level per bucket."""
    refused = int(reply[0])
    levels = [float(x) for x in reply[1 : 1 + len(buckets)]]
    return levels_of(buckets, levels, None if refused < 0 else refused)


def _reservation(reply: list[Any], at: int, count: int) -> Reservation:
    """`reserve`'s reply from `at`: admitted, refused, the number of groups, the groups, then
    the level per bucket."""
    refused = int(reply[at + 1])
    groups = at + 3 + int(reply[at + 2])
    return Reservation(
        admitted=int(reply[at]) == 1,
        groups=frozenset(int(g) for g in reply[at + 3 : groups]),
        levels=tuple(int(x) for x in reply[groups : groups + count]),
        refused=None if refused < 0 else refused,
    )
