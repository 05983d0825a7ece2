"""The `vkgate` command line: run the services, and manage vkgate through the admin API."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="vkgate")
def main() -> None:
    """vkgate: an OpenAI-compatible LLM gateway with virtual keys."""
