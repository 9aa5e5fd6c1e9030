"""The code blocks of the README and the documentation site, as the examples test runs them.

A fenced block whose language is Python (``python``, ``py``) or a shell (``bash``, ``sh``,
``shell``, ``console``) is an example a reader may copy, so the test suite runs it
(tests/docs/test_examples.py). One that cannot run here (it needs a GPU, a cluster, the
network, or more than a minute) has ``<!-- skip: why -->`` on the line before its fence
(blank lines between are allowed); the reason is what the test reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<why>.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code, and why it is skipped."""

    page: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None

    @property
    def kind(self) -> str | None:
        """``python``, ``shell``, or None for a block that is not run (TOML, JSON, text)."""
        return "python" if self.lang in PYTHON else "shell" if self.lang in SHELL else None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """The README and every Markdown page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the Markdown file `path`, in order."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence)
                                        and lines[end].strip().strip(fence[0]) == ""):
            end += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                for ln in lines[i + 1:end]]
        out.append(Block(str(path.relative_to(ROOT)), i + 1, m.group("lang").lower(),
                         "\n".join(body) + "\n", _skip_reason(lines, i)))
        i = end + 1
    return out


def _skip_reason(lines: list[str], fence: int) -> str | None:
    """The reason of a ``<!-- skip: ... -->`` marker right before line `fence`."""
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    m = SKIP.match(lines[j]) if j >= 0 else None
    return m.group("why") if m else None


def examples() -> list[Block]:
    """Every Python and shell block of the README and the site."""
    return [b for p in pages() for b in blocks(p) if b.kind]
