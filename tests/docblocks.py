"""The fenced blocks of a Markdown page, and what the documentation tests make of them.

A block's language says what it is: ``sh`` a command block a reader can paste into an
activated shell, anything else (``text``, ``sql``, ``python``, ``ini``) not a command.
An HTML comment on the line before a ``sh`` block tells the tests how to run it:

    <!-- docs-test: skip (why it cannot run on one machine) -->
    <!-- docs-test: background -->      (a server the next blocks talk to)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w-]*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(?P<mode>skip|background)\b\s*(?P<why>.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mode: str  # "run", "skip" or "background"
    why: str

    @property
    def where(self) -> str:
        root = Path(__file__).resolve().parent.parent
        path = self.path.resolve()
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        return f"{shown}:{self.line}"


class DocError(ValueError):
    """A Markdown page whose blocks the tests cannot classify."""


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, fence = i, match["fence"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise DocError(f"{path}:{start + 1}: code block never closed")
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        directive = DIRECTIVE.match(previous.strip())
        body = "\n".join(line[len(match["indent"]) :] for line in lines[start + 1 : end])
        found.append(
            Block(
                path=path,
                line=start + 1,
                lang=match["lang"],
                text=body + "\n",
                mode=directive["mode"] if directive else "run",
                why=directive["why"] if directive else "",
            )
        )
        i = end + 1
    return found
