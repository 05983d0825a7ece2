-- wrk script for bench/large_prompt.py: POSTs a chat body whose one user message holds
-- BENCH_PROMPT_BYTES bytes of filler text (no real prompt). BENCH_KEY: bearer token (omitted
-- when empty); BENCH_MODEL: model (default gpt-4o-mini).
-- Prints one line at the end: RESULT rps p50_ms p99_ms requests non2xx errors
local report = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "result.lua")

local key = os.getenv("BENCH_KEY") or ""
local model = os.getenv("BENCH_MODEL") or "gpt-4o-mini"
local size = tonumber(os.getenv("BENCH_PROMPT_BYTES") or "1024")
local word = "lorem ipsum "
local filler = string.rep(word, math.floor(size / #word) + 1):sub(1, size)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if key ~= "" then wrk.headers["Authorization"] = "Bearer " .. key end
wrk.body = '{"model":"' .. model .. '","messages":[{"role":"user","content":"' .. filler
  .. '"}],"max_tokens":64}'

function done(summary, latency, requests)
  report(summary, latency)
end
