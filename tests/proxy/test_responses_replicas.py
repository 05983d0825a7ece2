"""A stored response reached through another proxy process: the sealed id is all a replica
needs to continue, read or delete a conversation another replica began, with no store between
them; a replica whose internal secret has rolled on still opens ids sealed under the previous one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai

from tests.proxy.test_processes import admin_create, proxy_process
from tests.support.env import INTERNAL_SECRET
from tests.support.fake_openai import REPLY, serve_fake_openai
from tests.support.processes import sqlite_controlplane


def test_a_conversation_begun_on_one_proxy_continues_on_another(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve_fake_openai() as fake:
            with sqlite_controlplane(tmp_path) as controlplane:
                org = admin_create(controlplane, "/api/admin/organizations", {"name": "replicas"})
                project = admin_create(
                    controlplane, "/api/admin/projects", {"organization_id": org["id"], "name": "p"}
                )
                provider = admin_create(
                    controlplane,
                    "/api/admin/providers",
                    {
                        "organization_id": org["id"],
                        "name": "gpt",
                        "kind": "openai_compatible",
                        "base_url": fake.url,
                        "api_key": fake.api_key,
                    },
                )
                policy = admin_create(
                    controlplane,
                    "/api/admin/routing-policies",
                    {
                        "organization_id": org["id"],
                        "name": "p",
                        "aliases": {"chat": [{"provider_id": provider["id"], "model": "gpt-5"}]},
                    },
                )
                key = admin_create(
                    controlplane,
                    "/api/admin/virtual-keys",
                    {"project_id": project["id"], "name": "k", "routing_policy_id": policy["id"]},
                )["key"]
                for name in ("a", "b"):
                    (tmp_path / name).mkdir()
                with (
                    proxy_process(controlplane.url, tmp_path / "a.log", tmp_path / "a") as a,
                    proxy_process(
                        controlplane.url,
                        tmp_path / "b.log",
                        tmp_path / "b",
                        # Rolled on: its ids are sealed under a new secret, a's under the old.
                        VKGATE_INTERNAL_SECRET="rolled-internal-secret-" + "n" * 32,
                        VKGATE_INTERNAL_SECRET_PREVIOUS=INTERNAL_SECRET,
                    ) as b,
                ):
                    first_proxy = openai.AsyncOpenAI(
                        base_url=a.url + "/v1", api_key=key, max_retries=0
                    )
                    second_proxy = openai.AsyncOpenAI(
                        base_url=b.url + "/v1", api_key=key, max_retries=0
                    )
                    async with first_proxy, second_proxy:
                        first = await first_proxy.responses.create(model="chat", input="hello")
                        upstream_first = next(iter(fake.responses))
                        second = await second_proxy.responses.create(
                            model="chat", input="and then?", previous_response_id=first.id
                        )
                        retrieved = await second_proxy.responses.retrieve(first.id)
                        items = await second_proxy.responses.input_items.list(second.id)
                        await second_proxy.responses.delete(first.id)
                        gone = await asyncio.gather(
                            first_proxy.responses.retrieve(first.id), return_exceptions=True
                        )
        assert second.output_text == REPLY
        assert second.previous_response_id == first.id
        # The second proxy gave the provider its own id of the first response.
        assert fake.received[1].json()["previous_response_id"] == upstream_first
        assert retrieved.id == first.id and retrieved.output_text == REPLY
        assert [item.type for item in items.data] == ["message", "message", "message"]
        assert isinstance(gone[0], openai.NotFoundError)
        assert upstream_first not in fake.responses

    asyncio.run(scenario())
