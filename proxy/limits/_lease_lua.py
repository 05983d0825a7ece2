"""The Lua of the lease store (`proxy.limits.lease_store`): one script per kind of bucket,
and one that runs many syncs of them in one call.

Each kind's body reads its bucket's keys and arguments as `KEYS` and `ARGV`; the batch script
wraps each body in a function of its own keys and arguments (they shadow the globals), so a
sync in a batch runs exactly as its own script would.
"""

from __future__ import annotations

from proxy.limits._budget_lua import LUA_BUDGETS, LUA_COMMON

SHARE = 4
"""A slice beyond what a request needs is at most this share of what is left (and of that, one
part per replica holding a lease): the fleet's idle slices stay a fraction of what is left."""


_LUA_LEASES = f"""
local SHARE = {SHARE}
-- Parse a lease field "<amount> <deadline>".
local function lease_of(value)
  local amount, deadline = string.match(value, '^(%S+) (%S+)$')
  return tonumber(amount), tonumber(deadline)
end

-- The extra beyond `need` a sync may give: up to want - need, at most a share of what is left
-- beyond need, divided among the holders.
local function extra_of(room, need, want, holders)
  local extra = math.floor((room - need) / (SHARE * (holders + 1)))
  if extra > want - need then extra = want - need end
  if extra < 0 then extra = 0 end
  return extra
end
"""

_TOKENS_BODY = """
-- KEYS[1]: the bucket's hash. ARGV: now, lease id, capacity, per_second, used, keep, need,
-- want, ttl, pay. Reply: granted, the lease's unused slice, the level, lapsed (1/0).
local now_s, me = ARGV[1], 'l:' .. ARGV[2]
local now, capacity, rate = tonumber(now_s), tonumber(ARGV[3]), tonumber(ARGV[4])
local used, keep, need = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local want, ttl, pay = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local h = redis.call('HGETALL', KEYS[1])
local level, ts, mine, others, holders, back, lapsed = nil, nil, nil, 0, 0, 0, 0
local gone = {}
for i = 1, #h, 2 do
  local field, value = h[i], h[i + 1]
  if field == 'level' then level = tonumber(value)
  elseif field == 'ts' then ts = tonumber(value)
  else
    local amount, deadline = lease_of(value)
    if deadline <= now then
      -- Lapsed: its replica stopped syncing; its unused slice comes back.
      back = back + amount
      gone[#gone + 1] = field
      if field == me then lapsed = 1 end
    elseif field == me then mine = amount
    else
      others, holders = others + amount, holders + 1
    end
  end
end
if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
if level == nil or ts == nil then level, ts = capacity, now end
level = level + back + math.max(0, now - ts) * rate
if ts < now then ts = now end
mine = (mine or 0) - used
-- Spent beyond the slice (a token count corrected upwards, or a lapsed lease): from the level.
if mine < 0 then level, mine = level + mine, 0 end
if keep < mine then level, mine = level + mine - keep, keep end
-- Never more than the capacity, the leases' unused slices counted in.
local room = capacity - others - mine
if level > room then level = room end
local granted = 0
if need > 0 then
  if level >= need then
    granted = need + extra_of(level, need, want, holders)
    -- What the request that asked pays at once never enters the slice: no report is owed.
    level, mine = level - granted, mine + granted - pay
  else
    granted = -1
  end
end
if mine > 0 then
  redis.call('HSET', KEYS[1], me, num(mine) .. ' ' .. num(now + ttl), 'level', num(level),
             'ts', num(ts))
else
  redis.call('HDEL', KEYS[1], me)
  if holders == 0 and level >= capacity then
    -- Full, and no lease: the same as a bucket never seen.
    redis.call('DEL', KEYS[1])
    return {num(granted), '0', num(level), lapsed}
  end
  redis.call('HSET', KEYS[1], 'level', num(level), 'ts', num(ts))
end
local refill_s = 86400
if rate > 0 then refill_s = (capacity - level) / rate end
redis.call('PEXPIRE', KEYS[1], ms(math.max(refill_s, ttl) + MARGIN_S))
return {num(granted), num(mine), num(level), lapsed}
"""

_SLOTS_BODY = """
-- KEYS[1]: the slots' hash. ARGV: now, lease id, limit, must, keep, need, want, ttl.
-- Reply: granted, the lease's slots, the slots all leases hold, lapsed (1/0).
local now, me, limit = tonumber(ARGV[1]), 'l:' .. ARGV[2], tonumber(ARGV[3])
local must, keep, need = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local want, ttl = tonumber(ARGV[7]), tonumber(ARGV[8])
local h = redis.call('HGETALL', KEYS[1])
local others, holders, had, lapsed = 0, 0, false, 0
local gone = {}
for i = 1, #h, 2 do
  local field = h[i]
  local amount, deadline = lease_of(h[i + 1])
  if deadline <= now then
    gone[#gone + 1] = field
    if field == me then lapsed = 1 end
  elseif field == me then had = true
  else
    others, holders = others + amount, holders + 1
  end
end
if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
local room = limit - others - must
if not had and keep > room then keep = math.max(0, room) end
local mine = must + keep
room = room - keep
local granted = 0
if need > 0 then
  if room >= need then
    granted = need + extra_of(room, need, want, holders)
    mine = mine + granted
  else
    granted = -1
  end
end
if mine > 0 then
  redis.call('HSET', KEYS[1], me, int(mine) .. ' ' .. num(now + ttl))
  redis.call('PEXPIRE', KEYS[1], ms(ttl + MARGIN_S))
else
  redis.call('HDEL', KEYS[1], me)
end
return {granted, mine, others + mine, lapsed}
"""

_BUDGET_BODY = """
-- KEYS: hash, deadlines, acknowledged seconds. ARGV: now, lease id, ledger, ledger_as_of,
-- expires_at, limit, blocking, had, must, keep, need, want, ttl, entry, settled, hold_s, acked.
-- Reply: granted, the lease's slice, the bucket's level, lapsed (1/0).
local now_s, me = ARGV[1], 'o:' .. ARGV[2]
local now = tonumber(now_s)
local limit, blocking, had = tonumber(ARGV[6]), ARGV[7] == '1', ARGV[8] == '1'
local must, keep, need = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local want, ttl, settled = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[15])
local b = budget_open(KEYS[1], KEYS[2], KEYS[3], now, now_s, ARGV[3], ARGV[4], {me})
local old = b.mine[me]
local lapsed = 0
if old == nil then
  old = 0
  if had then lapsed = 1 end
end
b.open, b.level = b.open - old, b.level - old
if settled ~= 0 and ARGV[17] == '1' then
  -- The ledger has every request of the entry already: acknowledged now, as `ledgered` would.
  local second = int(math.floor(now))
  b.ack, b.level, b.sums = (b.ack or 0) + settled, b.level + settled, true
  redis.call('HINCRBY', b.hash, 'a:' .. second, int(settled))
  redis.call('ZADD', b.ak, second, second)
  local ttl = redis.call('PTTL', b.hash)
  if ttl > 0 then redis.call('PEXPIRE', b.ak, ttl) end
elseif settled ~= 0 then
  local field = 'u:' .. ARGV[14]
  b.set[field] = ARGV[15]
  b.unl, b.level = b.unl + settled, b.level + settled
  redis.call('ZADD', b.dl, num(now + tonumber(ARGV[16])), field)
  b.added = true
end
local room = limit - b.level - must
if lapsed == 1 and blocking and keep > room then keep = math.max(0, room) end
local mine = must + keep
room = room - keep
local granted = 0
if need > 0 then
  if blocking and need > room then
    granted = -1
  else
    granted = need + extra_of(math.max(room, need), need, want, 0)
  end
end
if granted > 0 then mine = mine + granted end
if mine > 0 then
  b.set[me] = int(mine)
  redis.call('ZADD', b.dl, num(now + ttl), me)
  b.added = true
elseif old > 0 then
  redis.call('HDEL', b.hash, me)
  redis.call('ZREM', b.dl, me)
end
b.open, b.level, b.sums = b.open + mine, b.level + mine, true
budget_close(b, now, ARGV[5])
return {granted, mine, b.level, lapsed}
"""


_TOKENS = LUA_COMMON + _LUA_LEASES + _TOKENS_BODY
_SLOTS = LUA_COMMON + _LUA_LEASES + _SLOTS_BODY
_BUDGET = LUA_COMMON + LUA_BUDGETS + _LUA_LEASES + _BUDGET_BODY


def _function(name: str, body: str) -> str:
    """A script's body as a function of its keys and arguments (they shadow the globals)."""
    return f"local function {name}(KEYS, ARGV)\n{body}\nend\n"


BATCH = (
    LUA_COMMON
    + LUA_BUDGETS
    + _LUA_LEASES
    + _function("tokens", _TOKENS_BODY)
    + _function("slots", _SLOTS_BODY)
    + _function("budget", _BUDGET_BODY)
    + """
-- Many syncs in one call. ARGV: per sync its script (0 tokens, 1 slots, 2 budget), its number
-- of keys and of arguments, then its keys and its arguments. (The keys are not declared: on
-- Cluster, declared keys must share one slot.) Reply: per sync its script's reply, or
-- {'!', the error} (a sync's error leaves the others be).
local scripts = {tokens, slots, budget}
local replies = {}
local a = 1
while a <= #ARGV do
  local script = scripts[tonumber(ARGV[a]) + 1]
  local nk, na = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = ARGV[a + 2 + i] end
  for i = 1, na do args[i] = ARGV[a + 2 + nk + i] end
  a = a + 3 + nk + na
  local ok, reply = pcall(script, keys, args)
  if not ok then
    if type(reply) == 'table' then reply = reply.err end
    reply = {'!', tostring(reply)}
  end
  replies[#replies + 1] = reply
end
return replies
"""
)
BATCH_CLUSTER = "#!lua flags=allow-cross-slot-keys\n" + BATCH
"""On Redis Cluster, the syncs of one master in one call (Redis 7 and later)."""


TOKENS_SCRIPT, SLOTS_SCRIPT, BUDGET_SCRIPT = 0, 1, 2
"""Each sync's script (`Call.script`): its index in `SCRIPTS`, and its number in `BATCH`."""
SCRIPTS = (_TOKENS, _SLOTS, _BUDGET)
