-- wrk script for bench/memory.py: POSTs the chat body of load.lua, each request with the next
-- key of BENCH_KEYS_FILE (one key a line, taken in turn, round and round). After
-- BENCH_STOP_AFTER responses (use -t1: the count is per thread) it stops sending and creates
-- BENCH_DONE_FILE, for the caller to interrupt wrk (which would wait out its -d otherwise).
-- Prints one line at the end: RESULT rps p50_ms p99_ms requests non2xx errors
local report = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "result.lua")

local path = os.getenv("BENCH_KEYS_FILE")
local stop_after = tonumber(os.getenv("BENCH_STOP_AFTER") or "0")
local done_file = os.getenv("BENCH_DONE_FILE")
local keys = {}
for line in io.lines(path) do
  if line ~= "" then keys[#keys + 1] = line end
end
local body = '{"model":"gpt-4o-mini","messages":['
  .. '{"role":"system","content":"Answer in one sentence."},'
  .. '{"role":"user","content":"Which river runs through Paris?"}],"max_tokens":64}'
local headers = {["Content-Type"] = "application/json"}
local next_key = 0
local responses = 0
wrk.method = "POST"

function request()
  next_key = next_key % #keys + 1
  headers["Authorization"] = "Bearer " .. keys[next_key]
  return wrk.format(nil, nil, headers, body)
end

function response(status, response_headers, response_body)
  responses = responses + 1
  if stop_after > 0 and responses == stop_after then
    wrk.thread:stop()
    if done_file then io.open(done_file, "w"):close() end
  end
end

function done(summary, latency, requests)
  report(summary, latency)
end
