-- wrk script for bench/invalid_keys.py: POSTs a chat body with a key that will be refused.
-- BENCH_KEY_MODE: `fixed` (BENCH_KEY on every request) or `random` (a fresh random `vk-` key
-- of the real format, 43 URL-safe characters, on every request). BENCH_MODEL: model.
-- Prints at the end: RESULT rps p50_ms p99_ms requests non2xx errors
-- and: STATUS s200 s401 s429 other
local report = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "result.lua")

local mode = os.getenv("BENCH_KEY_MODE") or "fixed"
local key = os.getenv("BENCH_KEY") or ""
local model = os.getenv("BENCH_MODEL") or "gpt-4o-mini"
local body = '{"model":"' .. model .. '","messages":['
  .. '{"role":"user","content":"Which river runs through Paris?"}],"max_tokens":64}'
local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. key
wrk.body = body

local threads = {}
function setup(thread) table.insert(threads, thread) end

function init(args)
  s200, s401, s429, other = 0, 0, 0, 0
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
end

if mode == "random" then
  local chars = {}
  function request()
    for i = 1, 43 do
      local at = math.random(1, 64)
      chars[i] = alphabet:sub(at, at)
    end
    wrk.headers["Authorization"] = "Bearer vk-" .. table.concat(chars)
    return wrk.format(nil, nil, nil, body)
  end
end

function response(status, headers, response_body)
  if status == 200 then s200 = s200 + 1
  elseif status == 401 then s401 = s401 + 1
  elseif status == 429 then s429 = s429 + 1
  else other = other + 1 end
end

function done(summary, latency, requests)
  report(summary, latency)
  local t200, t401, t429, tother = 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    t200 = t200 + thread:get("s200")
    t401 = t401 + thread:get("s401")
    t429 = t429 + thread:get("s429")
    tother = tother + thread:get("other")
  end
  io.write(string.format("STATUS %d %d %d %d\n", t200, t401, t429, tother))
end
