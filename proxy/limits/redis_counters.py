"""`RedisCounters`: the counters every replica shares, each call one atomic Lua script.

Layout (P is the prefix; every key of a bucket carries the bucket's key as its hash tag, so
they share a cluster slot):

- token bucket `P tb:{key}`: hash `level`, `ts` (floats as `%.17g`). A full bucket is deleted
  (it equals one never seen); otherwise it expires once it would be full again, plus a margin.
- slots `P sl:{key}`: sorted set, member request id, score its lease's deadline.
- budget bucket `P bg:{key}`: hash `base` and `asof` (the ledger figure and when it was read;
  no `asof` until a figure is given), `open`, `unl`, `ack` (running sums, integer nano-USD),
  `exp` (the window's `expires_at`), `o:<request id>` (an open reservation's amount),
  `u:<request id>` (settled, unacknowledged spend; 0 once acknowledged, kept so that settling
  or acknowledging again stays a no-op) and `a:<second>` (spend acknowledged in that whole unix
  second). `P bg:{key}:dl` is a sorted set of the `o:…` and `u:…` entries scored by their
  deadline: lapsed ones are found with ZRANGEBYSCORE -inf now, so a check costs O(1) plus what
  lapsed. `P bg:{key}:ak` is a sorted set of the seconds that have an `a:…` field, scored by
  the second: every call forgets the seconds before the first one still counted (see
  `ACKED_KEEP_S`, `LEDGER_SKEW_S`), so `ack` is the sum of the rest and a check costs O(1) plus
  what it forgot.

Time is the caller's `now`, never Redis's clock, so tests drive it; expiries are set relative
to that `now` (`expires_at - now`, not EXPIREAT), which only matters when the two clocks
disagree, and a window past `expires_at` is also forgotten by the scripts themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from redis.asyncio import Redis

from proxy.limits.store import (
    ACKED_KEEP_S,
    LEDGER_SKEW_S,
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
-- A bucket refilled to `now`: its level and the time it is measured at.
local function refilled(key, now, capacity, rate)
  local state = redis.call('HMGET', key, 'level', 'ts')
  local level, ts = tonumber(state[1]), tonumber(state[2])
  if level == nil or ts == nil then return capacity, now end
  -- A replica whose clock is behind refills nothing rather than the same time twice.
  return math.min(capacity, level + math.max(0, now - ts) * rate), math.max(ts, now)
end

local function store(key, level, ts, capacity, rate)
  if level >= capacity then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'level', num(level), 'ts', num(ts))
  local refill_s = 86400
  if rate > 0 then refill_s = (capacity - level) / rate end
  redis.call('PEXPIRE', key, ms(refill_s + MARGIN_S))
end

local function bucket_args(i)
  local at = 1 + 3 * (i - 1)
  return tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
end
"""

_TAKE = (
    _LUA_COMMON
    + _LUA_TOKENS
    + """
-- KEYS: one hash per bucket. ARGV: now, then capacity, per_second, cost per bucket.
local now = tonumber(ARGV[1])
local levels, stamps = {}, {}
for i = 1, #KEYS do
  local capacity, rate = bucket_args(i)
  levels[i], stamps[i] = refilled(KEYS[i], now, capacity, rate)
end
local refused, wait = -1, 0
for i = 1, #KEYS do
  local _, rate, cost = bucket_args(i)
  if levels[i] < cost then
    if refused < 0 then refused = i - 1 end
    wait = math.max(wait, (cost - levels[i]) / rate)
  end
end
if refused < 0 then
  for i = 1, #KEYS do
    local capacity, rate, cost = bucket_args(i)
    levels[i] = levels[i] - cost
    store(KEYS[i], levels[i], stamps[i], capacity, rate)
  end
end
local remaining, reset = {}, {}
for i = 1, #KEYS do
  local capacity, rate = bucket_args(i)
  remaining[i] = num(levels[i])
  if levels[i] >= capacity then reset[i] = '0' else reset[i] = num((capacity - levels[i]) / rate) end
end
return {refused, remaining, reset, num(wait)}
"""
)

_ADJUST = (
    _LUA_COMMON
    + _LUA_TOKENS
    + """
-- KEYS: one hash per bucket. ARGV: now, then capacity, per_second, cost per bucket.
local now = tonumber(ARGV[1])
for i = 1, #KEYS do
  local capacity, rate, cost = bucket_args(i)
  local level, ts = refilled(KEYS[i], now, capacity, rate)
  store(KEYS[i], math.min(capacity, level - cost), ts, capacity, rate)
end
"""
)

_ACQUIRE = (
    _LUA_COMMON
    + """
-- KEYS: the slots' sorted set. ARGV: now, request id, limit, lease_s.
local key, now, request_id = KEYS[1], tonumber(ARGV[1]), ARGV[2]
redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[1])
if redis.call('ZSCORE', key, request_id) then return 1 end
if redis.call('ZCARD', key) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', key, num(now + tonumber(ARGV[4])), request_id)
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', key, ms(tonumber(last[2]) - now + MARGIN_S))
return 1
"""
)

_LUA_BUDGETS = (
    f"local SKEW, KEEP = {LEDGER_SKEW_S!r}, {ACKED_KEEP_S!r}\n"
    + """
-- Bucket i's keys and where its `per` arguments start after ARGV[first].
local function budget(i, first, per)
  return KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], first + per * (i - 1)
end

-- Forget an ended window, then drop the entries that lapsed by now.
local function lapse(hash, dl, ak, now, now_s)
  local exp = tonumber(redis.call('HGET', hash, 'exp'))
  if exp and exp <= now then redis.call('DEL', hash, dl, ak) end
  local lapsed = redis.call('ZRANGEBYSCORE', dl, '-inf', now_s)
  for _, entry in ipairs(lapsed) do
    local amount = tonumber(redis.call('HGET', hash, entry))
    if amount and amount ~= 0 then
      local sum = 'unl'
      if string.sub(entry, 1, 2) == 'o:' then sum = 'open' end
      redis.call('HINCRBY', hash, sum, int(-amount))
    end
    redis.call('HDEL', hash, entry)
  end
  if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', dl, '-inf', now_s) end
end

-- Lapse, take a newer ledger figure as the base, forget acknowledged spend it covers (or
-- older than KEEP); the level.
local function load(hash, dl, ak, now, now_s, ledger, as_of_s)
  lapse(hash, dl, ak, now, now_s)
  local as_of = tonumber(redis.call('HGET', hash, 'asof'))
  if as_of == nil or tonumber(as_of_s) > as_of then
    redis.call('HSET', hash, 'base', ledger, 'asof', as_of_s)
    as_of = tonumber(as_of_s)
  end
  local first = int(math.max(math.floor(as_of - SKEW), math.floor(now - KEEP)))
  local old = redis.call('ZRANGEBYSCORE', ak, '-inf', '(' .. first)
  if #old > 0 then
    local gone = 0
    for _, second in ipairs(old) do
      local field = 'a:' .. second
      gone = gone + (tonumber(redis.call('HGET', hash, field)) or 0)
      redis.call('HDEL', hash, field)
    end
    redis.call('HINCRBY', hash, 'ack', int(-gone))
    redis.call('ZREMRANGEBYSCORE', ak, '-inf', '(' .. first)
  end
  local sums = redis.call('HMGET', hash, 'base', 'open', 'unl', 'ack')
  local level = 0
  for _, x in ipairs(sums) do level = level + (tonumber(x) or 0) end
  return level
end

-- The window's end, for the lazy check above and for the keys' expiry.
local function expire(hash, dl, ak, now, expires_at)
  if expires_at == '' or redis.call('EXISTS', hash) == 0 then return end
  redis.call('HSET', hash, 'exp', expires_at)
  local ttl = ms(tonumber(expires_at) - now)
  redis.call('PEXPIRE', hash, ttl)
  redis.call('PEXPIRE', dl, ttl)
  redis.call('PEXPIRE', ak, ttl)
end
"""
)

_RESERVE = (
    _LUA_COMMON
    + _LUA_BUDGETS
    + """
-- KEYS: hash, deadlines, acknowledged seconds per bucket. ARGV: request id, now, lease_s, then
-- per bucket limit, ledger, ledger_as_of, blocking (1/0), group, expires_at ('' for none),
-- amount.
local request_id, now_s, now, lease = ARGV[1], ARGV[2], tonumber(ARGV[2]), tonumber(ARGV[3])
local open_field, settled_field = 'o:' .. request_id, 'u:' .. request_id
local n = #KEYS / 3
local b, levels, again = {}, {}, false
for i = 1, n do
  local hash, dl, ak, at = budget(i, 3, 7)
  b[i] = {hash = hash, dl = dl, ak = ak, limit = tonumber(ARGV[at + 1]),
          blocking = ARGV[at + 4] == '1', group = tonumber(ARGV[at + 5]),
          expires_at = ARGV[at + 6], amount = ARGV[at + 7]}
  levels[i] = load(hash, dl, ak, now, now_s, ARGV[at + 2], ARGV[at + 3])
  b[i].held = redis.call('HEXISTS', hash, open_field) == 1
              or redis.call('HEXISTS', hash, settled_field) == 1
  if b[i].held then again = true end
end

local function finish(admitted, refused, groups)
  for i = 1, n do expire(b[i].hash, b[i].dl, b[i].ak, now, b[i].expires_at) end
  return {admitted, refused, levels, groups}
end

if again then
  -- A repeat (say, a retry after a timeout): report what the first call did.
  local groups, seen = {}, {}
  for i = 1, n do
    if b[i].held and b[i].group > 0 and not seen[b[i].group] then
      seen[b[i].group] = true
      groups[#groups + 1] = b[i].group
    end
  end
  return finish(1, -1, groups)
end

local refusing = {}
for i = 1, n do
  refusing[i] = b[i].blocking and levels[i] + tonumber(b[i].amount) > b[i].limit
  if b[i].group == 0 and refusing[i] then return finish(0, i - 1, {}) end
end

local given, dropped, last = {}, {}, 0
for i = 1, n do
  local g = b[i].group
  if g > 0 then
    given[g] = true
    last = math.max(last, g)
    if refusing[i] then dropped[g] = true end
  end
end
local survivors = {}
for g in pairs(given) do
  if not dropped[g] then survivors[#survivors + 1] = g end
end
if last > 0 and #survivors == 0 then
  for i = 1, n do
    if b[i].group == last and refusing[i] then return finish(0, i - 1, {}) end
  end
end

local deadline = num(now + lease)
for i = 1, n do
  if b[i].group == 0 or not dropped[b[i].group] then
    redis.call('HSET', b[i].hash, open_field, b[i].amount)
    redis.call('HINCRBY', b[i].hash, 'open', b[i].amount)
    redis.call('ZADD', b[i].dl, deadline, open_field)
    levels[i] = levels[i] + tonumber(b[i].amount)
  end
end
return finish(1, -1, survivors)
"""
)

_SETTLE = (
    _LUA_COMMON
    + _LUA_BUDGETS
    + """
-- KEYS: hash, deadlines, acknowledged seconds per bucket. ARGV: request id, now, hold_s, then
-- per bucket ledger, ledger_as_of, expires_at ('' for none), cost.
local request_id, now_s, now, hold = ARGV[1], ARGV[2], tonumber(ARGV[2]), tonumber(ARGV[3])
local open_field, settled_field = 'o:' .. request_id, 'u:' .. request_id
for i = 1, #KEYS / 3 do
  local hash, dl, ak, at = budget(i, 3, 4)
  load(hash, dl, ak, now, now_s, ARGV[at + 1], ARGV[at + 2])
  if redis.call('HEXISTS', hash, settled_field) == 0 then
    local reserved = tonumber(redis.call('HGET', hash, open_field))
    if reserved then
      if reserved ~= 0 then redis.call('HINCRBY', hash, 'open', int(-reserved)) end
      redis.call('HDEL', hash, open_field)
      redis.call('ZREM', dl, open_field)
    end
    local cost = ARGV[at + 4]
    if tonumber(cost) ~= 0 then
      redis.call('HSET', hash, settled_field, cost)
      redis.call('HINCRBY', hash, 'unl', cost)
      redis.call('ZADD', dl, num(now + hold), settled_field)
    end
  end
  expire(hash, dl, ak, now, ARGV[at + 3])
end
"""
)

_LEDGERED = (
    _LUA_COMMON
    + _LUA_BUDGETS
    + """
-- KEYS: hash, deadlines, acknowledged seconds per bucket. ARGV: now, then per bucket the
-- number of its request ids and those ids.
local now_s, now = ARGV[1], tonumber(ARGV[1])
local second = int(math.floor(now))
local at = 2
for i = 1, #KEYS / 3 do
  local hash, dl, ak = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  lapse(hash, dl, ak, now, now_s)
  local moved = 0
  for j = 1, tonumber(ARGV[at]) do
    local field = 'u:' .. ARGV[at + j]
    local amount = tonumber(redis.call('HGET', hash, field))
    if amount and amount ~= 0 then
      moved = moved + amount
      redis.call('HSET', hash, field, '0')
    end
  end
  at = at + 1 + tonumber(ARGV[at])
  if moved ~= 0 then
    redis.call('HINCRBY', hash, 'unl', int(-moved))
    redis.call('HINCRBY', hash, 'ack', int(moved))
    redis.call('HINCRBY', hash, 'a:' .. second, int(moved))
    redis.call('ZADD', ak, second, second)
    local ttl = redis.call('PTTL', hash)
    if ttl > 0 then redis.call('PEXPIRE', ak, ttl) end
  end
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
        self._prefix = prefix
        self._take = client.register_script(_TAKE)
        self._adjust = client.register_script(_ADJUST)
        self._acquire = client.register_script(_ACQUIRE)
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        self._ledgered = client.register_script(_LEDGERED)

    async def take(self, buckets: Sequence[Bucket], now: float) -> Levels:
        reply = await self._take(keys=self._token_keys(buckets), args=_token_args(buckets, now))
        refused, remaining, reset, wait = reply
        return Levels(
            admitted=int(refused) < 0,
            remaining=tuple(float(x) for x in remaining),
            reset_s=tuple(float(x) for x in reset),
            retry_after_s=float(wait),
            refused=None if int(refused) < 0 else int(refused),
        )

    async def adjust(self, buckets: Sequence[Bucket], now: float) -> None:
        await self._adjust(keys=self._token_keys(buckets), args=_token_args(buckets, now))

    async def acquire(self, slots: Slots, request_id: str, now: float) -> bool:
        held = await self._acquire(
            keys=[self._slots_key(slots)],
            args=[repr(now), request_id, slots.limit, repr(slots.lease_s)],
        )
        return int(held) == 1

    async def release(self, slots: Slots, request_id: str) -> None:
        # One command is atomic on its own: no script needed.
        await self._client.zrem(self._slots_key(slots), request_id)

    async def reserve(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Reservation:
        args: list[str | int] = [request_id, repr(now), repr(lease_s)]
        for b, amount in zip(buckets, amounts, strict=True):
            args += [
                b.limit_nanos,
                b.ledger_nanos,
                repr(float(b.ledger_as_of)),
                int(b.blocking),
                b.group,
                _expires(b),
                int(amount),
            ]
        admitted, refused, levels, groups = await self._reserve(
            keys=self._budget_keys(b.key for b in buckets), args=args
        )
        return Reservation(
            admitted=int(admitted) == 1,
            groups=frozenset(int(g) for g in groups),
            levels=tuple(int(x) for x in levels),
            refused=None if int(refused) < 0 else int(refused),
        )

    async def settle(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        args: list[str | int] = [request_id, repr(now), repr(hold_s)]
        for b, cost in zip(buckets, costs, strict=True):
            args += [b.ledger_nanos, repr(float(b.ledger_as_of)), _expires(b), int(cost)]
        await self._settle(keys=self._budget_keys(b.key for b in buckets), args=args)

    async def ledgered(self, entries: Sequence[tuple[str, str]], now: float) -> None:
        if not entries:
            return
        by_bucket: dict[str, list[str]] = {}
        for key, request_id in entries:
            by_bucket.setdefault(key, []).append(request_id)
        args: list[str | int] = [repr(now)]
        for request_ids in by_bucket.values():
            args += [len(request_ids), *request_ids]
        await self._ledgered(keys=self._budget_keys(by_bucket), args=args)

    async def close(self) -> None:
        await self._client.aclose()

    def _token_keys(self, buckets: Sequence[Bucket]) -> list[str]:
        return [f"{self._prefix}tb:{{{b.key}}}" for b in buckets]

    def _slots_key(self, slots: Slots) -> str:
        return f"{self._prefix}sl:{{{slots.key}}}"

    def _budget_key(self, key: str) -> str:
        return f"{self._prefix}bg:{{{key}}}"

    def _budget_keys(self, keys: Iterable[str]) -> list[str]:
        out: list[str] = []
        for key in keys:
            hash_key = self._budget_key(key)
            out += [hash_key, hash_key + ":dl", hash_key + ":ak"]
        return out


def _token_args(buckets: Sequence[Bucket], now: float) -> list[str]:
    args = [repr(now)]
    for b in buckets:
        args += [repr(float(b.capacity)), repr(float(b.per_second)), repr(float(b.cost))]
    return args


def _expires(bucket: BudgetBucket) -> str:
    return "" if bucket.expires_at is None else repr(float(bucket.expires_at))
