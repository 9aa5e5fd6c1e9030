"""Loading a tokenizer leaves no parsing garbage resident: the Rust engine parses a
33 MB tokenizer.json through temporary allocations that glibc keeps in the heap after
they are freed (176 MB for the bundled Qwen vocabulary). A forked worker shares those
pages and a spawned one loads its own, so every process paid for them."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, sys
def heap_mb():
    name, total = None, 0
    for line in open("/proc/self/smaps"):
        parts = line.split()
        if not parts[0].endswith(":"):
            name = parts[5] if len(parts) > 5 else ""
        elif parts[0] == "Rss:" and name == "[heap]":
            total += int(parts[1])
    return total / 1024
from zephon_core import load_tokenizer, qwen_tokenizer_dir
before = heap_mb()
load_tokenizer(qwen_tokenizer_dir())
loaded = heap_mb()
ctypes.CDLL(None).malloc_trim(0)
print(before, loaded, heap_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_loaded_tokenizer_holds_no_freed_heap():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True).stdout.split()
    before, loaded, trimmed = (float(x) for x in out)
    assert loaded - before > 20, "the tokenizer itself takes room"
    assert loaded - trimmed < 10, (f"{loaded - trimmed:.0f} MB of freed heap left resident "
                                   "after loading the tokenizer")
