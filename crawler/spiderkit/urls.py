"""URL lists for spiders: streamed line by line, checked, and split into shards."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

from scrapy.exceptions import UsageError


def check_url(text: str) -> str | None:
    """Why ``text`` is not an absolute http(s) URL, or None when it is one."""
    if any(c.isspace() for c in text):
        return "contains white space"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "not an absolute http(s) URL"
    if not parts.hostname:
        return "no host name"
    return None


class UrlList:
    """The lines of a URL list, streamed: ``(line number, url, problem)`` per entry.

    Blank lines and ``#`` comments are skipped. Opening happens at construction, so a
    missing or unreadable file is an error before the crawl starts.
    """

    def __init__(self, path: str):
        self.path = path
        if path == "-":
            self._file = sys.stdin.buffer
            self.name = "<stdin>"
        else:
            self.name = path
            try:
                self._file = open(path, "rb")
            except OSError as exc:
                raise UsageError(f"cannot read the URL list {path}: {exc.strerror}") from None

    def __iter__(self) -> Iterator[tuple[int, str, str | None]]:
        with self._file as f:
            for number, raw in enumerate(f, 1):
                if number == 1 and raw.startswith(_BOM):
                    # Spreadsheets export UTF-8 lists with a byte-order mark.
                    raw = raw[len(_BOM) :]
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    yield number, raw.decode("utf-8", "replace").strip(), "not UTF-8 text"
                    continue
                if not line or line.startswith("#"):
                    continue
                yield number, line, check_url(line)

    def batches(self, size: int) -> Iterator[list[tuple[int, str, str | None]]]:
        """The entries in lists of up to ``size``, as ``(line number, text, problem)``;
        unlike iteration, only undecodable lines have their problem filled in (the
        caller checks the rest: ``crawler.spiderkit.start`` does it cheaply)."""
        number = 0
        batch: list[tuple[int, str, str | None]] = []
        with self._file as f:
            # readlines(hint): whole blocks of lines at C speed.
            while lines := f.readlines(1 << 16):
                for raw in lines:
                    number += 1
                    if number == 1 and raw.startswith(_BOM):
                        raw = raw[len(_BOM) :]
                    try:
                        line = raw.decode("utf-8").strip()
                    except UnicodeDecodeError:
                        line = raw.decode("utf-8", "replace").strip()
                        batch.append((number, line, "not UTF-8 text"))
                        continue
                    if line and line[0] != "#":
                        batch.append((number, line, None))
                        if len(batch) >= size:
                            yield batch
                            batch = []
        if batch:
            yield batch

    def count(self) -> int | None:
        """Entries in the list (None for standard input), for the progress line.

        Counted in 1 MiB blocks with C-level byte counts, so that a list of millions
        costs the crawl's thread next to nothing; lines holding only white space are
        counted as entries.
        """
        if self.path == "-":
            return None
        entries = 0
        last = b"\n"
        with open(self.path, "rb") as f:
            while block := f.read(1 << 20):
                # Each entry starts after a newline (``last`` is the previous block's
                # end): a line split between two blocks is counted once.
                entries += _entries(last + block)
                last = block[-1:]
        return entries


def parse_shard(value: str | None) -> tuple[int, int] | None:
    """``"I/N"`` as ``(I, N)`` with 0 <= I < N; None when not given."""
    if not value:
        return None
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        raise UsageError(f"-a shard takes I/N (e.g. 0/40), not {value!r}") from None
    if not 0 <= index < count:
        raise UsageError(f"-a shard={value}: I must be 0 to N-1")
    return index, count


def in_shard(key: str, shard: tuple[int, int] | None) -> bool:
    """Whether a request key falls in the shard (stable: ``int(key, 16) % N == I``)."""
    return shard is None or int(key, 16) % shard[1] == shard[0]


_BOM = b"\xef\xbb\xbf"
_ENTRY_START = re.compile(rb"(?m)^[^#\r\n]")


def _entries(data: bytes) -> int:
    """Newlines of ``data`` followed in it by an entry's first character (not ``#``
    or a line end). The count holds the GIL, so the crawl's thread waits while it
    runs: a plain count of newlines is ~10 times faster than the regex, which only
    the few blocks with a comment or blank line need."""
    if b"\n#" in data or b"\n\n" in data or b"\n\r" in data:
        return len(_ENTRY_START.findall(data, 1))
    return data.count(b"\n", 0, len(data) - 1)
