"""The Lua of a budget bucket in Redis, shared by every script that touches one.

A budget bucket `P bg:{key}` (P is the prefix; the bucket's key is the hash tag, so its keys
share a cluster slot) is a hash: `base` and `asof` (the ledger figure and when it was read; no
`asof` until a figure is given), `open`, `unl`, `ack` (running sums, integer nano-USD), `exp`
(the window's `expires_at`), `o:<id>` (an open reservation: a replica's leased slice),
`u:<entry>` (settled spend the ledger has not acknowledged; removed, with its deadline, once
acknowledged) and `a:<second>` (spend acknowledged in that whole unix second). `P bg:{key}:dl`
is a sorted set of the `o:…` and `u:…` entries scored by their deadline: lapsed ones are found
with ZRANGEBYSCORE -inf now, so a call costs O(1) plus what lapsed. `P bg:{key}:ak` is a sorted
set of the seconds that have an `a:…` field: every call forgets the seconds before the first one
still counted (see `ACKED_KEEP_S`, `LEDGER_SKEW_S`), so `ack` is the sum of the rest. The keys
expire with the window: from the first call that records its end.

Every script reads the hash once (one HMGET), decides, then sets its fields with one HSET
(running sums written as computed: the script is atomic). Time is the caller's `now`, never
Redis's clock, so tests drive it; expiries are set relative to that `now` (`expires_at - now`,
not EXPIREAT), and a window past `expires_at` is also forgotten by the scripts themselves.
"""

from __future__ import annotations

from proxy.limits.store import ACKED_KEEP_S, LEDGER_SKEW_S

LUA_COMMON = """
local MARGIN_S = 60
local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end
local function ms(seconds) return int(math.max(1, math.ceil(seconds * 1000))) end
"""

LUA_BUDGETS = (
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

LEDGERED = (
    LUA_COMMON
    + LUA_BUDGETS
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
