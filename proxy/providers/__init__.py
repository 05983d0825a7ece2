"""Provider adapters by kind: the registry the proxy compiles credential chains against."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from proxy.providers._http import ProviderMisconfigured
from proxy.providers.anthropic import AnthropicMessages
from proxy.providers.base import (
    Operation,
    Provider,
    ProviderTimeout,
    ProviderUnreachable,
    Upstream,
    WireFormat,
)
from proxy.providers.mock import MockProvider
from proxy.providers.openai import AZURE_OPENAI, OPENAI, OPENAI_COMPATIBLE, OpenAIFormat
from vkgate.clock import Clock

__all__ = [
    "Operation",
    "Provider",
    "ProviderMisconfigured",
    "ProviderTimeout",
    "ProviderUnreachable",
    "Upstream",
    "WireFormat",
    "registry",
]


def registry(session: aiohttp.ClientSession, clock: Clock) -> Mapping[str, Provider]:
    return {
        "openai": OpenAIFormat(OPENAI, session),
        "openai_compatible": OpenAIFormat(OPENAI_COMPATIBLE, session),
        "azure_openai": OpenAIFormat(AZURE_OPENAI, session),
        "anthropic": AnthropicMessages(session),
        "mock": MockProvider(clock),
    }
