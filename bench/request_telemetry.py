"""What telemetry costs a request: µs per finished request for its metrics alone, with its
`request_completed` JSON line written to a file, and with a traced span; and what a scrape
costs with many label sets. Prints a table; asserts nothing. Bounded by `--requests`.

    .venv/bin/python bench/request_telemetry.py [--requests 50000]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from proxy.dispatch import Outcome
from proxy.errors import Cause
from proxy.telemetry.metrics import ProxyMetrics
from proxy.telemetry.observe import RequestObserver
from vkgate.errors import ErrorCode
from vkgate.logs import JsonFormatter, skip_unused_record_fields


class _Runtime:
    vk_id = "vk_01a2301a29f9708b38779f46"
    organization_id = "org_01a2301a290417226b6dcba8"
    chains = {"chat": ()}


class _Upstream:
    provider_name = "openai"
    provider_id = "prov_01a2301a29"


def outcome() -> Outcome:
    done = Outcome()
    done.upstream = _Upstream()  # type: ignore[assignment]
    done.calls = 1
    done.status = 200
    done.sent_at, done.committed_at, done.first_byte_at = 1.0001, 1.0008, 1.0009
    return done


def per_call(run: Callable[[], None], count: int, repeats: int = 5) -> float:
    """Median µs per call over `repeats` rounds of `count` calls."""
    rounds = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(count):
            run()
        rounds.append((time.perf_counter() - started) / count * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    args = parser.parse_args()
    count = args.requests // 5
    rows: list[tuple[str, float]] = []

    skip_unused_record_fields()  # as `vkgate proxy` runs
    logger = logging.getLogger("vkgate.proxy.requests")
    logger.propagate = False
    with tempfile.TemporaryDirectory() as work:
        handler = logging.FileHandler(Path(work) / "requests.log")
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
        for name, log_requests, level in (
            ("metrics only (VKGATE_LOG_REQUESTS=false)", False, logging.INFO),
            ("metrics + request_completed line", True, logging.INFO),
            ("metrics, log level WARNING", True, logging.WARNING),
        ):
            logger.setLevel(level)
            metrics = ProxyMetrics()
            observer = RequestObserver(
                metrics, time.monotonic, log_requests=log_requests, telemetry_key=b"k" * 32
            )
            done = outcome()
            rows.append(
                (
                    name,
                    per_call(
                        lambda observer=observer, done=done: observer.completed(
                            "/v1/chat/completions",
                            200,
                            None,
                            1.0,
                            b"5f1c0c6e4b7d4a0f9c2e8d1a3b6f7e90",
                            runtime=_Runtime(),  # type: ignore[arg-type]
                            model="chat",
                            outcome=done,
                            end_user="user-1",
                        ),
                        count,
                    ),
                )
            )
        logger.removeHandler(handler)
        handler.close()

    metrics = ProxyMetrics()
    observer = RequestObserver(metrics, time.monotonic, log_requests=False)
    failed = outcome()
    failed.causes.append(Cause("azure", "prov_2", 503, ErrorCode.PROVIDER_ERROR))
    for status in (200, 400, 401, 404, 429, 500, 502, 503):
        for model in ("chat", "embed", "gpt-4o", "claude", "llama"):
            for route in ("/v1/chat/completions", "/v1/messages", "/v1/embeddings"):
                observer.completed(
                    route,
                    status,
                    None,
                    1.0,
                    b"r",
                    runtime=_Runtime(),
                    model=model,
                    outcome=failed,  # type: ignore[arg-type]
                )
    rows.append(("scrape (120 label sets, 3 histograms)", per_call(metrics.render, 200)))

    width = max(len(name) for name, _ in rows)
    print(f"| {'case'.ljust(width)} | µs |")
    print(f"|{'-' * (width + 2)}|---:|")
    for name, micros in rows:
        print(f"| {name.ljust(width)} | {micros:,.1f} |")


if __name__ == "__main__":
    main()
