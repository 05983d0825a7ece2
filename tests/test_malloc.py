"""The C allocator's set-up: blocks over the threshold go back to the system when freed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vkgate import malloc

pytestmark = pytest.mark.skipif(
    not malloc._glibc(), reason="the threshold is glibc's (this C library is not)"
)

# Frees a 4 MiB block first (after which glibc would serve 2 MiB blocks from its heap), then
# holds sixteen 2 MiB blocks, each followed by a small block that stays (the heap's top), and
# prints how much resident memory freeing the large ones left behind.
SCRIPT = """
import os, sys
from vkgate.malloc import return_large_blocks

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

print(return_large_blocks({} if sys.argv[1] == "set" else {"MALLOC_MMAP_THRESHOLD_": "1"}))
first = bytearray(4 << 20)
del first
base = rss()
large, small = [], []
for _ in range(16):
    large.append(bytearray(2 << 20))
    small.append(bytearray(4096))
held = rss() - base
del large
print(held, rss() - base)
"""


def run(mode: str) -> tuple[bool, int, int]:
    # Without glibc's own variable, so the default is what "left" measures.
    env = {k: v for k, v in os.environ.items() if k != malloc.THRESHOLD_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, check=True
    )
    was_set, sizes = done.stdout.splitlines()
    held, kept = (int(n) for n in sizes.split())
    return was_set == "True", held, kept


def test_large_blocks_go_back_to_the_system_once_freed() -> None:
    was_set, held, kept = run("set")
    assert was_set
    assert held >= 32 << 20
    assert kept < 2 << 20


def test_without_it_the_heap_keeps_what_was_freed() -> None:
    """What the set-up is for: glibc's raised threshold keeps the freed blocks resident."""
    was_set, held, kept = run("left")
    assert not was_set  # glibc's own variable names a threshold: left as it says
    assert kept >= held // 2


def test_nothing_is_set_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_glibc(name: str) -> str:
        raise ValueError(name)

    monkeypatch.setattr(os, "confstr", no_glibc)
    assert not malloc.return_large_blocks({})
