"""The official `openai` and `anthropic` SDKs through the proxy to Bedrock, Google AI Studio and
Vertex AI credentials (fakes that speak each wire format and check each credential): plain,
streamed and with tools, errors in the client's own format."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.proxy.cloud_support import (
    BEDROCK,
    BEDROCK_MODEL,
    COHERE,
    FAILOVER,
    GEMINI,
    GEMINI_MODEL,
    GOOGLE_EMBED,
    HELLO,
    TITAN,
    VERTEX,
    WEATHER_TOOL_ANTHROPIC,
    WEATHER_TOOL_OPENAI,
    Clouds,
    make_clouds,
)
from tests.proxy.conftest import RunningProxy, add_key, add_policy
from tests.support import fake_bedrock as FB
from tests.support import fake_gemini as FG
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini


@pytest.fixture
async def clouds(
    client: httpx.AsyncClient,
    proxy: RunningProxy,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
) -> Clouds:
    return await make_clouds(client, proxy, fake_bedrock, fake_gemini)


async def test_openai_sdk_reaches_bedrock_through_converse_signed_with_sigv4(
    clouds: Clouds,
) -> None:
    async with clouds.openai() as sdk:
        reply = await sdk.chat.completions.create(
            model=BEDROCK,
            messages=[{"role": "system", "content": "Be brief."}, *HELLO],
            max_tokens=64,
            temperature=0.2,
        )
    assert reply.choices[0].message.content == FB.REPLY
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == BEDROCK_MODEL
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == clouds.bedrock.input_tokens
    assert reply.usage.completion_tokens == clouds.bedrock.output_tokens
    sent = clouds.bedrock.received[-1]
    assert sent.path == "/model/anthropic.claude-3-5-haiku-20241022-v1:0/converse"
    assert sent.json() == {
        "messages": [{"role": "user", "content": [{"text": "hello"}]}],
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {"maxTokens": 64, "temperature": 0.2},
    }
    assert clouds.bedrock.signed_by == [FB.ACCESS_KEY_ID]


async def test_openai_sdk_streams_from_bedrock(clouds: Clouds) -> None:
    async with clouds.openai() as sdk:
        stream = await sdk.chat.completions.create(
            model=BEDROCK, messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == FB.REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == clouds.bedrock.input_tokens
    assert clouds.bedrock.received[-1].path.endswith("/converse-stream")


async def test_openai_sdk_calls_a_tool_through_bedrock_and_answers_it(clouds: Clouds) -> None:
    async with clouds.openai() as sdk:
        first = await sdk.chat.completions.create(
            model=BEDROCK, messages=HELLO, tools=[WEATHER_TOOL_OPENAI], tool_choice="required"
        )
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert first.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == FB.TOOL_INPUT
        second = await sdk.chat.completions.create(
            model=BEDROCK,
            messages=[
                *HELLO,
                first.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            ],
            tools=[WEATHER_TOOL_OPENAI],
        )
    assert second.choices[0].message.content == FB.REPLY
    sent = clouds.bedrock.received[-1].json()
    assert sent["messages"][-1] == {
        "role": "user",
        "content": [{"toolResult": {"toolUseId": call.id, "content": [{"text": "sunny"}]}}],
    }
    assert sent["toolConfig"]["tools"][0]["toolSpec"]["name"] == "get_weather"


async def test_anthropic_sdk_reaches_bedrock_plain_and_streamed_with_tools(clouds: Clouds) -> None:
    async with clouds.anthropic() as sdk:
        message = await sdk.messages.create(model=BEDROCK, max_tokens=64, messages=HELLO)
        assert message.content[0].type == "text" and message.content[0].text == FB.REPLY
        assert message.usage.input_tokens == clouds.bedrock.input_tokens
        async with sdk.messages.stream(
            model=BEDROCK,
            max_tokens=64,
            messages=HELLO,
            tools=[WEATHER_TOOL_ANTHROPIC],
            tool_choice={"type": "any"},
        ) as stream:
            final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"
    tool = final.content[0]
    assert tool.type == "tool_use" and tool.name == "get_weather" and tool.input == FB.TOOL_INPUT
    assert final.usage.output_tokens == clouds.bedrock.output_tokens
    assert clouds.bedrock.received[-1].json()["toolConfig"]["toolChoice"] == {"any": {}}


@pytest.mark.parametrize("alias", [GEMINI, VERTEX])
async def test_openai_sdk_reaches_gemini_and_vertex_plain_and_streamed(
    clouds: Clouds, alias: str
) -> None:
    async with clouds.openai() as sdk:
        reply = await sdk.chat.completions.create(model=alias, messages=HELLO, max_tokens=32)
        stream = await sdk.chat.completions.create(
            model=alias, messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    assert reply.choices[0].message.content == FG.REPLY
    assert reply.model == f"{GEMINI_MODEL}-001"
    assert reply.usage is not None and reply.usage.prompt_tokens == clouds.gemini.prompt_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == FG.REPLY
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == clouds.gemini.candidates_tokens
    sent = clouds.gemini.received[-2]
    assert sent.json() == {
        "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
        "generationConfig": {"maxOutputTokens": 32},
    }
    paths = [r.path for r in clouds.gemini.received if not r.path.endswith("/token")]
    if alias == VERTEX:
        assert paths[-1] == (
            f"/v1/projects/{FG.PROJECT}/locations/{FG.LOCATION}/publishers/google/models/"
            f"{GEMINI_MODEL}:streamGenerateContent"
        )
        assert clouds.gemini.grants == 1, "one token serves both requests"
    else:
        assert paths[-1] == f"/v1beta/models/{GEMINI_MODEL}:streamGenerateContent"


@pytest.mark.parametrize("alias", [GEMINI, VERTEX])
async def test_tool_calls_through_gemini_keep_the_thought_signature_for_the_next_turn(
    clouds: Clouds, alias: str
) -> None:
    async with clouds.anthropic() as sdk:
        first = await sdk.messages.create(
            model=alias, max_tokens=64, messages=HELLO, tools=[WEATHER_TOOL_ANTHROPIC]
        )
        tool = first.content[0]
        assert first.stop_reason == "tool_use"
        assert tool.type == "tool_use" and tool.input == FG.TOOL_ARGS
        second = await sdk.messages.create(
            model=alias,
            max_tokens=64,
            tools=[WEATHER_TOOL_ANTHROPIC],
            messages=[
                *HELLO,
                # The SDK's own blocks, as a client hands the answer back.
                {"role": "assistant", "content": first.content},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": tool.id, "content": "sunny"}
                    ],
                },
            ],
        )
    assert second.content[0].type == "text" and second.content[0].text == FG.REPLY
    contents = clouds.gemini.received[-1].json()["contents"]
    assert contents[1] == {
        "role": "model",
        "parts": [
            {
                "functionCall": {"name": "get_weather", "args": FG.TOOL_ARGS},
                "thoughtSignature": FG.THOUGHT_SIGNATURE,
            }
        ],
    }
    assert contents[2] == {
        "role": "user",
        "parts": [{"functionResponse": {"name": "get_weather", "response": {"content": "sunny"}}}],
    }


async def test_a_throttled_bedrock_credential_falls_over_to_gemini(clouds: Clouds) -> None:
    clouds.bedrock.fail_next(429, "Too many requests, please wait before trying again.")
    async with clouds.openai() as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model=FAILOVER, messages=HELLO)
    reply = raw.parse()
    assert reply.choices[0].message.content == FG.REPLY
    assert raw.headers["x-vkgate-provider"] == "studio"
    assert raw.headers["x-vkgate-fallback-count"] == "1"


async def test_a_stream_that_opens_with_a_throttling_exception_falls_over_before_any_byte(
    clouds: Clouds,
) -> None:
    clouds.bedrock.open_with_exception = "throttlingException"
    async with (
        clouds.anthropic() as sdk,
        sdk.messages.stream(model=FAILOVER, max_tokens=32, messages=HELLO) as stream,
    ):
        final = await stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == FG.REPLY
    assert clouds.bedrock.received[-1].path.endswith("/converse-stream")


async def test_bedrock_validation_error_is_passed_back_in_the_clients_format(
    clouds: Clouds,
) -> None:
    clouds.bedrock.fail_next(400, "The model returned the following errors: bad input")
    async with clouds.anthropic() as sdk:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await sdk.messages.create(model=FAILOVER, max_tokens=32, messages=HELLO)
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "bad input" in refused.value.body["error"]["message"]  # type: ignore[index]
    assert len(clouds.gemini.received) == 0, "a validation error is the answer, not a failover"


@pytest.mark.parametrize("status", [408, 424, 503])
async def test_bedrock_model_timeouts_and_failures_fall_through(
    clouds: Clouds, status: int
) -> None:
    """ModelTimeout (408) and ModelError (424) are the provider's failures, not the client's:
    the chain goes on, as for a 5xx; a lone credential's failure is a 502."""
    async with clouds.openai() as sdk:
        clouds.bedrock.fail_next(status, "the model failed")
        raw = await sdk.chat.completions.with_raw_response.create(model=FAILOVER, messages=HELLO)
        assert raw.headers["x-vkgate-provider"] == "studio"
        clouds.bedrock.fail_next(status, "the model failed")
        with pytest.raises(openai.APIStatusError) as failed:
            await sdk.chat.completions.create(model=BEDROCK, messages=HELLO)
    assert failed.value.status_code == 502
    assert failed.value.body["code"] == "provider_error"  # type: ignore[index]


async def test_a_signature_bedrock_refuses_is_its_403_passed_back(clouds: Clouds) -> None:
    clouds.bedrock.keys[FB.ACCESS_KEY_ID].secret = "not the secret the proxy holds"
    async with clouds.openai() as sdk:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await sdk.chat.completions.create(model=BEDROCK, messages=HELLO)
    assert "signature" in refused.value.message


async def test_a_prompt_gemini_blocks_is_a_400_and_a_safety_stop_a_content_filter_finish(
    clouds: Clouds,
) -> None:
    clouds.gemini.block_prompt = "SAFETY"
    async with clouds.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as blocked:
            await sdk.chat.completions.create(model=GEMINI, messages=HELLO)
        assert "safety filters blocked the prompt (SAFETY)" in blocked.value.message
        clouds.gemini.stop_for = "SAFETY"
        stopped = await sdk.chat.completions.create(model=GEMINI, messages=HELLO)
    assert stopped.choices[0].finish_reason == "content_filter"
    clouds.gemini.stop_for = "SAFETY"
    async with clouds.anthropic() as claude:
        message = await claude.messages.create(model=GEMINI, max_tokens=16, messages=HELLO)
    assert message.stop_reason == "refusal"


async def test_an_untranslatable_field_is_a_400_naming_it(clouds: Clouds) -> None:
    async with clouds.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(model=BEDROCK, messages=HELLO, n=2)
    assert refused.value.body["param"] == "n"  # type: ignore[index]
    assert "Bedrock" in refused.value.message
    assert clouds.bedrock.received == []


@pytest.mark.parametrize(
    ("alias", "inputs"),
    [(TITAN, "one text"), (COHERE, ["one text", "and another"]), (GOOGLE_EMBED, ["a", "b c"])],
)
async def test_embeddings_reach_bedrock_and_google_models(
    clouds: Clouds, alias: str, inputs: str | list[str]
) -> None:
    async with clouds.openai() as sdk:
        floats = await sdk.embeddings.create(model=alias, input=inputs, encoding_format="float")
        encoded = await sdk.embeddings.create(model=alias, input=inputs, dimensions=4)
    count = 1 if isinstance(inputs, str) else len(inputs)
    assert [e.index for e in floats.data] == list(range(count))
    assert all(len(e.embedding) == 3 for e in floats.data)
    assert all(len(e.embedding) == 4 for e in encoded.data), "base64 decoded by the SDK"
    if alias == TITAN:
        assert floats.usage.prompt_tokens == 2


async def test_an_inference_profile_arn_goes_in_the_path_encoded_and_signed(
    client: httpx.AsyncClient, clouds: Clouds
) -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0"
    policy = await add_policy(
        client, clouds.tenant.org, {"profile": [(clouds.providers["bedrock"], arn)]}
    )
    _, key = await add_key(client, clouds.tenant, policy=policy)
    async with clouds.proxy.openai(key) as sdk:
        reply = await sdk.chat.completions.create(model="profile", messages=HELLO)
    assert reply.choices[0].message.content == FB.REPLY
    assert reply.model == arn
    raw = clouds.bedrock.raw_paths[-1]
    assert raw == (
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2F"
        "us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"
    )
    assert clouds.bedrock.signed_by[-1] == FB.ACCESS_KEY_ID
