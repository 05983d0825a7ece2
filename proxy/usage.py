"""Token usage as the spend record counts it, whatever format the provider reported it in.

OpenAI's convention throughout: `input_tokens` counts every input token, cache reads and writes
included (Anthropic reports those apart, so they are added in); `reasoning_tokens` are part of
`output_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
