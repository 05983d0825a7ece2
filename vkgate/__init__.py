"""vkgate: an OpenAI-compatible LLM gateway with virtual keys."""

__version__ = "0.1.0"
