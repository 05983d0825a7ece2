"""Provider adapters by kind: the registry the proxy compiles credential chains against."""

from __future__ import annotations

from collections.abc import Mapping

from proxy.providers._client import HttpClient
from proxy.providers._connection import Timeouts
from proxy.providers.anthropic import AnthropicMessages
from proxy.providers.base import (
    Operation,
    Provider,
    ProviderMisconfigured,
    ProviderTimeout,
    ProviderUnreachable,
    Upstream,
    WireFormat,
)
from proxy.providers.bedrock import Bedrock
from proxy.providers.gemini import GEMINI, VERTEX_AI, GoogleGenAI
from proxy.providers.mock import MockProvider
from proxy.providers.openai import AZURE_OPENAI, OPENAI, OPENAI_COMPATIBLE, OpenAIFormat
from vkgate.clock import Clock

__all__ = [
    "HttpClient",
    "Operation",
    "Provider",
    "ProviderMisconfigured",
    "ProviderTimeout",
    "ProviderUnreachable",
    "Timeouts",
    "Upstream",
    "WireFormat",
    "registry",
]


def registry(client: HttpClient, clock: Clock) -> Mapping[str, Provider]:
    return {
        "openai": OpenAIFormat(OPENAI, client),
        "openai_compatible": OpenAIFormat(OPENAI_COMPATIBLE, client),
        "azure_openai": OpenAIFormat(AZURE_OPENAI, client),
        "anthropic": AnthropicMessages(client),
        "mock": MockProvider(clock),
        "bedrock": Bedrock(client, clock),
        "gemini": GoogleGenAI(GEMINI, client, clock),
        "vertex_ai": GoogleGenAI(VERTEX_AI, client, clock),
    }
