-- wrk script for bench/proxy_overhead.py: POSTs a two-message chat body.
-- BENCH_KEY: bearer token (omitted when empty); BENCH_MODEL: model (default gpt-4o-mini);
-- BENCH_STREAM=1: a streaming request that asks for usage.
-- Prints one line at the end: RESULT rps p50_ms p99_ms requests non2xx errors
local report = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "result.lua")

local key = os.getenv("BENCH_KEY") or ""
local model = os.getenv("BENCH_MODEL") or "gpt-4o-mini"
local stream = os.getenv("BENCH_STREAM") == "1"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if key ~= "" then wrk.headers["Authorization"] = "Bearer " .. key end
local body = '{"model":"' .. model .. '","messages":['
  .. '{"role":"system","content":"Answer in one sentence."},'
  .. '{"role":"user","content":"Which river runs through Paris?"}],"max_tokens":64'
if stream then body = body .. ',"stream":true,"stream_options":{"include_usage":true}' end
wrk.body = body .. "}"

function done(summary, latency, requests)
  report(summary, latency)
end
