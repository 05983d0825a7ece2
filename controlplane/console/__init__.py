"""The web console: server-drawn pages at `/console` over the admin API's own services."""

from __future__ import annotations

from controlplane.console.app import console_router, console_templates

__all__ = ["console_router", "console_templates"]
