"""Help text that reads in an 80-column terminal, for the project's Scrapy commands
(``crawler/cli.py``) and its plain tools (``python -m slurm.task``, ``slurm/submit``,
``python -m demo.site``, the benchmarks): a docstring's paragraphs, bullets ("- ") and
indented example lines kept apart, its reST markup (````code````, ``:class:`x```) shown
as plain text. No Scrapy here: a tool's ``-h`` imports nothing it does not need."""

from __future__ import annotations

import argparse
import re
import textwrap

# An indented line of two columns (a path and what it is), split where the gap is.
_COLUMNS = re.compile(r"^(\s*\S.*?\s{2,})(\S.*)$")
# ``code`` and :role:`target` (or :role:`text <target>`), as docstrings write them.
_LITERAL = re.compile(r"``([^`]+)``")
_ROLE = re.compile(r":[a-z]+:`(?:[^`<]*<)?~?([^`>]+)>?`")


def plain(text: str) -> str:
    """*text* with its reST markup as plain text: ``x`` and :class:`a.B` as x and a.B."""
    return _ROLE.sub(r"\1", _LITERAL.sub(r"\1", text))


def fill_paragraph(paragraph: str, width: int, indent: str = "") -> list[str]:
    """One paragraph's lines: text wrapped to *width*, a bullet ("- ") and its indented
    continuation wrapped under its dash, an indented line (an example) kept as is."""
    items: list[list[str]] = []  # [kind, text]: "text", "bullet" or "verbatim"
    for line in paragraph.splitlines():
        stripped = line.strip()
        if line.startswith("  ") and items and items[-1][0] == "bullet":
            items[-1][1] += " " + stripped  # a bullet's indented continuation
        elif line.startswith("  ") and not stripped.startswith("- "):
            columns = _COLUMNS.match(items[-1][1]) if items and items[-1][0] == "verbatim" else None
            if columns and len(line) - len(line.lstrip()) >= len(columns.group(1)):
                items[-1][1] += " " + stripped  # a table row's second column, continued
            else:
                items.append(["verbatim", line.rstrip()])
        elif stripped.startswith("- "):
            items.append(["bullet", stripped[2:]])
        elif items and items[-1][0] != "verbatim":
            items[-1][1] += " " + stripped
        else:
            items.append(["text", stripped])
    lines: list[str] = []
    for kind, body in items:
        if kind == "verbatim":
            lines += verbatim(indent + body, width)
        elif kind == "bullet":
            lines += textwrap.wrap(
                body, width, initial_indent=indent + "- ", subsequent_indent=indent + "  "
            )
        else:
            lines += textwrap.wrap(body, width, initial_indent=indent, subsequent_indent=indent)
    return lines


def verbatim(line: str, width: int) -> list[str]:
    """An example or table line as it is when it fits; else its second column (or, for
    one column, the rest of it) wrapped under itself."""
    if len(line) <= width:
        return [line]
    columns = _COLUMNS.match(line)
    if columns and len(columns.group(1)) < width // 2:
        head, rest = columns.groups()
        hang = " " * len(head)
    else:
        hang = " " * (len(line) - len(line.lstrip()) + 4)
        head, rest = "", line
    wrapped = textwrap.wrap(rest, width - len(hang), break_on_hyphens=False) or [""]
    if not head:
        first, *more = textwrap.wrap(rest, width, break_on_hyphens=False)
        wrapped = [first, *textwrap.wrap(" ".join(more), width - len(hang))] if more else [first]
        return [wrapped[0]] + [hang + part for part in wrapped[1:]]
    return [head + wrapped[0]] + [hang + part for part in wrapped[1:]]


def fill(text: str, width: int, indent: str = "") -> str:
    """Every paragraph of *text* (blank-line separated) as :func:`fill_paragraph` lays
    it out."""
    blocks = re.split(r"\n\s*\n", textwrap.dedent(text).strip("\n"))
    return "\n\n".join("\n".join(fill_paragraph(b, width, indent)) for b in blocks)


class ToolHelpFormatter(argparse.HelpFormatter):
    """argparse's layout, with descriptions and epilogs laid out by :func:`fill` from
    plain text (:func:`plain`), at most 80 columns wide."""

    def __init__(self, prog: str, **kwargs):
        kwargs["width"] = min(kwargs.get("width") or 80, 80)
        super().__init__(prog, **kwargs)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return fill(plain(text), width, indent)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(plain(text), width)


def tool_parser(prog: str, doc: str | None, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser for a plain tool whose help is its docstring *doc*."""
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=ToolHelpFormatter, **kwargs
    )
