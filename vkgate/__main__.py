"""Entry point for `python -m vkgate`."""

from vkgate.cli import main

main()
