"""Usage as the spend record counts it, read from recorded OpenAI and Anthropic answers and
streams, however the stream is cut."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.usage import (
    AnthropicStreamUsage,
    AnthropicUsage,
    CompletionTokensDetails,
    MalformedAnswer,
    OpenAIUsage,
    OutputTokensDetails,
    PromptTokensDetails,
    TokenUsage,
    anthropic_answer,
    from_anthropic,
    from_openai,
    openai_answer,
)
from tests.support.streams import cuts

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


# -- conversions ---------------------------------------------------------------------------------


def test_openai_usage_counts_cached_tokens_as_cache_reads_within_the_input() -> None:
    usage = OpenAIUsage(
        prompt_tokens=100,
        completion_tokens=40,
        total_tokens=140,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=64, cache_write_tokens=8),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=30),
    )
    assert from_openai(usage) == TokenUsage(
        input_tokens=100,
        output_tokens=40,
        cache_read_tokens=64,
        cache_write_tokens=8,
        reasoning_tokens=30,
    )


def test_openai_usage_without_details_or_with_null_details_counts_no_cache() -> None:
    bare = OpenAIUsage(prompt_tokens=5, completion_tokens=2, total_tokens=7)
    nulls = OpenAIUsage(
        prompt_tokens=5,
        completion_tokens=2,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=None),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=None),
    )
    assert from_openai(bare) == from_openai(nulls) == TokenUsage(5, 2)


def test_anthropic_usage_adds_cache_reads_and_writes_into_the_input() -> None:
    usage = AnthropicUsage(
        input_tokens=10,
        output_tokens=20,
        cache_read_input_tokens=300,
        cache_creation_input_tokens=50,
        output_tokens_details=OutputTokensDetails(thinking_tokens=12),
    )
    assert from_anthropic(usage) == TokenUsage(
        input_tokens=360,
        output_tokens=20,
        cache_read_tokens=300,
        cache_write_tokens=50,
        reasoning_tokens=12,
    )


# -- whole answers -------------------------------------------------------------------------------


def test_openai_chat_answer_gives_usage_and_served_model() -> None:
    usage, model = openai_answer(sample("openai_chat_completion.json"))
    assert model == "gpt-4o-2024-08-06"
    assert usage == TokenUsage(input_tokens=1117, output_tokens=46, cache_read_tokens=1024)


def test_openai_reasoning_tokens_are_read() -> None:
    usage, _ = openai_answer(sample("openai_chat_completion_tool_calls.json"))
    assert usage == TokenUsage(input_tokens=82, output_tokens=217, reasoning_tokens=128)


def test_openai_embeddings_answer_gives_its_prompt_tokens() -> None:
    usage, model = openai_answer(sample("openai_embeddings.json"))
    assert (usage, model) == (TokenUsage(input_tokens=8), "text-embedding-3-small")


def test_anthropic_answer_gives_usage_with_caches_and_served_model() -> None:
    usage, model = anthropic_answer(sample("anthropic_message_tool_use.json"))
    assert model == "claude-sonnet-4-5-20250929"
    assert usage == TokenUsage(
        input_tokens=472 + 2048 + 1024,
        output_tokens=160,
        cache_read_tokens=2048,
        cache_write_tokens=1024,
    )


@pytest.mark.parametrize("read", [openai_answer, anthropic_answer])
@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"usage": {"prompt_tokens": "x", "input_tokens": "x"}}',
        b'{"model": 3}',
    ],
)
def test_an_answer_shaped_otherwise_gives_no_usage_and_never_raises(
    read: object, body: bytes
) -> None:
    assert callable(read)
    assert read(body) == (None, None)


@pytest.mark.parametrize("read", [openai_answer, anthropic_answer])
@pytest.mark.parametrize("body", [b"", b"not json", b"<html>502 Bad Gateway</html>", b'{"id": "x"'])
def test_an_answer_that_is_not_json_is_malformed(read: object, body: bytes) -> None:
    assert callable(read)
    with pytest.raises(MalformedAnswer):
        read(body)


@pytest.mark.parametrize("read", [openai_answer, anthropic_answer])
def test_an_answer_without_usage_gives_none_but_still_its_model(read: object) -> None:
    assert callable(read)
    assert read(b'{"model": "m", "choices": []}') == (None, "m")


# -- Anthropic streams passing through -----------------------------------------------------------

TOOL_STREAM_USAGE = TokenUsage(
    input_tokens=472 + 2048 + 1024,
    output_tokens=160,
    cache_read_tokens=2048,
    cache_write_tokens=1024,
)


def watched(pieces: list[bytes]) -> AnthropicStreamUsage:
    watcher = AnthropicStreamUsage()
    for piece in pieces:
        watcher.feed(piece)
    return watcher


def test_stream_usage_takes_input_from_message_start_and_output_from_message_delta() -> None:
    watcher = watched([sample("anthropic_stream_text.sse")])
    assert watcher.model == "claude-sonnet-4-5-20250929"
    assert watcher.usage == TokenUsage(input_tokens=12, output_tokens=10)


def test_stream_usage_counts_the_caches_of_message_start() -> None:
    assert watched([sample("anthropic_stream_tool_use.sse")]).usage == TOOL_STREAM_USAGE


def test_stream_usage_is_known_from_message_start_before_the_end() -> None:
    """A stream cut short still reports the input it was charged."""
    stream = sample("anthropic_stream_error.sse")
    watcher = watched([stream])
    assert watcher.usage == TokenUsage(input_tokens=25, output_tokens=1)


def test_a_later_message_delta_replaces_counts_it_reports_and_keeps_the_others() -> None:
    stream = (
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"c",'
        b'"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
        b'"usage":{"output_tokens":7}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{},'
        b'"usage":{"input_tokens":30,"output_tokens":9,'
        b'"output_tokens_details":{"thinking_tokens":4}}}\n\n'
    )
    assert watched([stream]).usage == TokenUsage(
        input_tokens=35, output_tokens=9, cache_read_tokens=5, reasoning_tokens=4
    )


def test_text_that_mentions_the_event_names_is_not_taken_for_them() -> None:
    stream = (
        b"event: content_block_delta\n"
        b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
        b'"text":"message_start message_delta \\"usage\\":{\\"output_tokens\\":99}"}}\n\n'
    )
    watcher = watched([stream])
    assert (watcher.usage, watcher.model) == (None, None)


@pytest.mark.parametrize("end", ["\r\n", "\r"], ids=["crlf", "cr"])
def test_stream_usage_is_read_whatever_the_line_endings(end: str) -> None:
    stream = sample("anthropic_stream_tool_use.sse").replace(b"\n", end.encode())
    assert watched([stream]).usage == TOOL_STREAM_USAGE


def test_stream_usage_is_the_same_fed_one_byte_at_a_time() -> None:
    stream = sample("anthropic_stream_tool_use.sse")
    assert watched([stream[i : i + 1] for i in range(len(stream))]).usage == TOOL_STREAM_USAGE


def test_stream_usage_is_the_same_for_a_cut_at_every_byte() -> None:
    stream = sample("anthropic_stream_text.sse")
    for cut in range(len(stream) + 1):
        watcher = watched([stream[:cut], stream[cut:]])
        assert watcher.usage == TokenUsage(input_tokens=12, output_tokens=10), f"cut at {cut}"
        assert watcher.model == "claude-sonnet-4-5-20250929"


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
@given(data=st.data())
def test_stream_usage_is_the_same_for_any_cuts(end: str, data: st.DataObject) -> None:
    stream = sample("anthropic_stream_tool_use.sse").replace(b"\n", end.encode())
    pieces = data.draw(cuts(stream))
    watcher = watched(pieces)
    assert watcher.usage == TOOL_STREAM_USAGE
    assert watcher.model == "claude-sonnet-4-5-20250929"


def test_an_unreadable_usage_event_is_skipped() -> None:
    stream = b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":\n\n'
    assert watched([stream]).usage is None
