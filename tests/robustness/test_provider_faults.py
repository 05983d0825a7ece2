"""Providers that hang, reset mid-answer or answer garbage, behind a real proxy process: each
request gets a clear answer, and the ledger one record saying what happened."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.proxy.test_processes import proxy_env
from tests.support.outcomes import outcomes_in_ledger
from tests.support.processes import free_port, running, sqlite_controlplane
from tests.support.upstreams import MODES, openai_like_upstream, send, upstream_tenant

SHIP_EVERY = {"VKGATE_SPEND_FLUSH_INTERVAL_SECONDS": "0.2"}


def test_providers_that_hang_reset_or_answer_garbage_are_each_one_ledger_record(
    tmp_path: Path,
) -> None:
    async def scenario() -> dict[str, tuple[int, bytes, dict[str, Any]]]:
        async with openai_like_upstream() as upstream:
            with sqlite_controlplane(tmp_path) as controlplane:
                port = free_port()
                env = proxy_env(
                    controlplane.url,
                    port,
                    VKGATE_SPOOL_DIR=str(tmp_path / "spool"),
                    VKGATE_PROVIDER_FIRST_BYTE_TIMEOUT_SECONDS="1",
                    **SHIP_EVERY,
                )
                with running(
                    ["proxy"], env=env, port=port, log=tmp_path / "proxy.log", cwd=tmp_path
                ) as proxy:
                    tenant, key = upstream_tenant(controlplane, upstream.url)
                    cases = [(mode, stream) for mode in MODES for stream in (False, True)]
                    results = await asyncio.gather(
                        *(send(proxy, key, mode, stream) for mode, stream in cases)
                    )
                    # The proxy is still fine after all of it, and a chain falls through a
                    # credential answering garbage to the next.
                    after = await send(proxy, key, "ok", False)
                    assert after[1] == 200
                    through = await send(proxy, key, "fallthrough", False)
                    assert through[1] == 200 and b'"content": "Hi"' in through[2], through
                    cases.append(("fallthrough", False))
                    results.append(through)
                    ids = [r[0] for r in results]
                    rows = await asyncio.to_thread(
                        outcomes_in_ledger, controlplane, tenant.org, ids
                    )
                    return {
                        f"{mode}{'-stream' if stream else ''}": (status, got, rows[request_id])
                        for (mode, stream), (request_id, status, got) in zip(
                            cases, results, strict=True
                        )
                    }

    seen = asyncio.run(scenario())
    for case, (status, _, row) in seen.items():
        assert row["status"] == status, (case, row)
        assert (row["kind"] == "confirm") == (status == 200), (case, row)
        if status != 200:
            assert row["cost_usd"] == "0", (case, row)
    assert seen["ok"][2]["usage_source"] == "provider"
    # A plain answer that is not JSON is the provider failing, not an answer to pass on.
    for case in ("garbage", "truncated", "noise", "reset"):
        status, body, row = seen[case]
        assert status == 502, (case, body)
        assert row["error_code"] == "provider_error", (case, row)
    for case in ("hang", "hang-stream", "stall"):
        status, body, row = seen[case]
        assert status == 504, (case, body)
        assert row["error_code"] == "provider_timeout", (case, row)
    # A stream that broke off after it began: the client has what was sent and an error
    # event; the ledger has the broken stream with what it is estimated to have cost.
    for case in ("reset-stream", "stall-stream"):
        status, body, row = seen[case]
        assert status == 200 and b'"Hi"' in body, (case, body)
        assert b"error" in body.rsplit(b'"Hi"', 1)[1], (case, body)
        assert row["error_code"] == "provider_error", (case, row)
        assert row["output_tokens"] >= 1, (case, row)
    assert seen["ok-stream"][2]["output_tokens"] >= 2, "each streamed event is counted"
    assert seen["fallthrough"][2]["attempts"] == 2
