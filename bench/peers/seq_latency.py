#!/usr/bin/env python3
"""Single-request overhead: N sequential chat requests over one keep-alive
connection, reports p50/p90/p99 latency in ms.  Standard library only, so the
client adds as little as possible and needs no venv.

  python3 seq_latency.py --url http://127.0.0.1:4000/v1/chat/completions \
      --key sk-bench-master-key --n 500   # or the key in BENCH_API_KEY

Every response is checked (HTTP 200, chat.completion with choices and usage);
any failure makes the exit status 1.  Last line is machine-readable:
  BENCH_RESULT rps=.. p50_ms=.. p90_ms=.. p99_ms=.. max_ms=.. requests=.. non2xx=.. sockerr=..
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import statistics
import sys
import time
import urllib.parse

BODY = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {
            "role": "user",
            "content": "What is the capital of France, and what river runs through it?",
        },
    ],
    "temperature": 0.2,
    "max_tokens": 64,
}


def percentile(sorted_vals: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of an already sorted list."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def check(status: int, raw: bytes) -> str | None:
    if status != 200:
        return f"HTTP {status}: {raw[:200]!r}"
    try:
        doc = json.loads(raw)
        doc["choices"][0]["message"]["content"]
        doc["usage"]["total_tokens"]
    except Exception as e:  # any shape error is a failure
        return f"bad body ({e!r}): {raw[:200]!r}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", required=True)
    ap.add_argument(
        "--key",
        default=os.environ.get("BENCH_API_KEY", ""),
        help="bearer token (Authorization header); default $BENCH_API_KEY",
    )
    ap.add_argument(
        "--header", action="append", default=[], help="extra 'Name: value' header, repeatable"
    )
    ap.add_argument("--model", default="gpt-4o-mini")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=10.0, help="per-request socket timeout, s")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="hard stop for the whole run")
    args = ap.parse_args()

    u = urllib.parse.urlsplit(args.url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        print(f"refusing non-loopback target {u.hostname}", file=sys.stderr)
        return 2
    path = u.path + (("?" + u.query) if u.query else "")
    body = json.dumps(dict(BODY, model=args.model)).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": "bench-seq/1.0",
    }
    if args.key:
        headers["Authorization"] = f"Bearer {args.key}"
    for h in args.header:
        name, _, value = h.partition(":")
        headers[name.strip()] = value.strip()

    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=args.timeout)
    lat: list[float] = []
    errors = 0
    first_error = None
    deadline = time.monotonic() + args.max_seconds
    for i in range(args.warmup + args.n):
        if time.monotonic() > deadline:
            print(f"stopped at max-seconds={args.max_seconds}", file=sys.stderr)
            break
        t0 = time.perf_counter()
        try:
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=args.timeout)
            status, raw = -1, repr(e).encode()
        dt = (time.perf_counter() - t0) * 1000.0
        err = check(status, raw)
        if i >= args.warmup:
            lat.append(dt)
            if err:
                errors += 1
                first_error = first_error or err
        elif err and first_error is None:
            first_error = "warmup: " + err
    conn.close()

    s = sorted(lat)
    total_s = sum(lat) / 1000.0
    if first_error:
        print(f"first error: {first_error}", file=sys.stderr)
    print(
        f"n={len(s)} mean={statistics.fmean(s) if s else float('nan'):.3f}ms "
        f"p50={percentile(s, 50):.3f}ms p90={percentile(s, 90):.3f}ms p99={percentile(s, 99):.3f}ms "
        f"max={s[-1] if s else float('nan'):.3f}ms errors={errors}"
    )
    print(
        f"BENCH_RESULT rps={len(s) / total_s if total_s else 0:.1f} p50_ms={percentile(s, 50):.3f} "
        f"p90_ms={percentile(s, 90):.3f} p99_ms={percentile(s, 99):.3f} max_ms={s[-1] if s else 0:.3f} "
        f"requests={len(s)} non2xx={errors} sockerr=0"
    )
    return 1 if errors or len(s) < args.n else 0


if __name__ == "__main__":
    sys.exit(main())
