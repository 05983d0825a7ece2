"""`vkgate up` as a new user meets it: one command starts both services, and stops both."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai

from proxy.providers.mock import EMBEDDING_DIMENSIONS, REPLY
from tests.support.processes import (
    EXIT_TIMEOUT_S,
    Service,
    banner_value,
    clean_env,
    free_port,
    kill_group,
    start,
    stop,
    vkgate,
    wait_until_closed,
    wait_until_healthy,
)


@dataclasses.dataclass
class Demo:
    up: Service
    proxy_url: str
    """As the banner prints it: the base URL the OpenAI SDK takes."""
    key: str


def start_demo(env: dict[str, str], cwd: Path, port: int, log: Path) -> Demo:
    """`vkgate up --demo`, once both its control plane and its proxy answer."""
    up = start(["up", "--demo"], env=env, port=port, log=log, cwd=cwd, own_group=True)
    try:
        wait_until_healthy(up)
        output = up.output()
        proxy_url = banner_value(output, "proxy")
        wait_until_healthy(dataclasses.replace(up, url=proxy_url.removesuffix("/v1")))
        return Demo(up, proxy_url, banner_value(output, "demo key"))
    except BaseException:
        stop(up.process)
        kill_group(up.process)
        raise


def assert_banner_commands_work(output: str) -> None:
    """The `curl` and the OpenAI SDK snippet the banner shows, run as printed, get answers."""
    curl = re.search(r"^ *(curl .*?')$", output, re.MULTILINE | re.DOTALL)
    assert curl, "no curl command in the banner"
    ran = subprocess.run(
        ["sh", "-c", curl.group(1)], capture_output=True, text=True, timeout=30, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["choices"][0]["message"]["content"] == REPLY

    snippet = re.search(r"^ *python -c '(.*?)'$", output, re.MULTILINE | re.DOTALL)
    assert snippet, "no OpenAI SDK snippet in the banner"
    ran = subprocess.run(
        [sys.executable, "-c", snippet.group(1)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    # The chat completion's answer, then the Responses API's (translated for the mock).
    assert ran.stdout.strip().splitlines() == [REPLY, REPLY]


def end(demo: Demo, how: signal.Signals) -> None:
    """Stop `vkgate up` as a user would, and check its proxy went with it."""
    demo.up.process.send_signal(how)
    try:
        code = demo.up.process.wait(timeout=EXIT_TIMEOUT_S * 2)
    except subprocess.TimeoutExpired:
        stop(demo.up.process)
        raise AssertionError(f"vkgate up did not exit after {how.name}") from None
    # Its output holds the demo key and the admin token: point at it rather than print it.
    assert code == 0, f"vkgate up exited with {code} after {how.name}; see {demo.up.log}"
    wait_until_closed(demo.proxy_url.removesuffix("/v1"))


def test_up_demo_serves_the_openai_sdk_and_keeps_its_key_across_restarts(tmp_path: Path) -> None:
    controlplane_port, proxy_port = free_port(), free_port()
    env = clean_env(
        VKGATE_HOME=str(tmp_path / "home"),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{controlplane_port}",
        VKGATE_PROXY_ADDR=f"127.0.0.1:{proxy_port}",
    )

    first = start_demo(env, tmp_path, controlplane_port, tmp_path / "up-1.log")
    try:
        assert first.proxy_url == f"http://127.0.0.1:{proxy_port}/v1"
        assert re.fullmatch(r"vk-[A-Za-z0-9_-]{20,}", first.key)
        assert_banner_commands_work(first.up.output())

        with openai.OpenAI(
            base_url=first.proxy_url, api_key=first.key, max_retries=0, timeout=10
        ) as client:
            reply = client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}]
            )
            assert reply.choices[0].message.content == REPLY
            assert reply.usage is not None and reply.usage.completion_tokens > 0

            stream = client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "Hello!"}],
                stream=True,
            )
            pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
            assert "".join(pieces) == REPLY

            embedded = client.embeddings.create(model="text-embedding-3-small", input="Hello!")
            assert len(embedded.data) == 1
            assert len(embedded.data[0].embedding) == EMBEDDING_DIMENSIONS

        end(first, signal.SIGINT)
    finally:
        stop(first.up.process)
        kill_group(first.up.process)  # a proxy that outlived it, if the test failed

    second = start_demo(env, tmp_path, controlplane_port, tmp_path / "up-2.log")
    try:
        assert second.key == first.key
        with openai.OpenAI(
            base_url=second.proxy_url, api_key=second.key, max_retries=0, timeout=10
        ) as client:
            reply = client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}]
            )
            assert reply.choices[0].message.content == REPLY

        end(second, signal.SIGTERM)
    finally:
        stop(second.up.process)
        kill_group(second.up.process)


def test_up_stops_and_fails_when_its_proxy_cannot_start(tmp_path: Path) -> None:
    controlplane_port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proxy_port = taken.getsockname()[1]
        env = clean_env(
            VKGATE_HOME=str(tmp_path / "home"),
            VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{controlplane_port}",
            VKGATE_PROXY_ADDR=f"127.0.0.1:{proxy_port}",
        )
        result = vkgate("up", env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the proxy exited with code" in result.stderr
