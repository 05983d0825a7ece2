-- What every wrk script of bench/ prints at its end, for the Python scripts to read:
--   RESULT rps p50_ms p99_ms requests non2xx errors
-- Loaded with `dofile` by the scripts beside it (see load.lua).
return function(summary, latency)
  local seconds = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format("RESULT %.1f %.3f %.3f %d %d %d\n",
    summary.requests / seconds, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.requests, e.status, e.connect + e.read + e.write + e.timeout))
end
