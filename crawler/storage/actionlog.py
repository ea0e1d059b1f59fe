"""The action log: append-only JSONL, one line per fetch attempt.

Every line is written whole by one ``write`` on a file opened with ``O_APPEND`` (the
cache hits of a batch of start requests share one), so lines from several processes
never interleave and a killed crawl leaves at most its last line incomplete.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from enum import StrEnum
from json.encoder import encode_basestring
from pathlib import Path


class Outcome(StrEnum):
    """What a line of the action log says of its attempt: the one list the crawl's
    counters (``actions/<outcome>``), its end summary and the report read."""

    OK = "ok"
    CACHE_HIT = "cache_hit"
    NOT_MODIFIED = "not_modified"
    RETRY = "retry"
    ERROR = "error"
    # An item of a stored page that could not be stored (pipelines/catalog.py).
    ITEM_ERROR = "item_error"
    # A page fetched again whose payload is the one stored for its key: kept as a
    # revisit record referring to it (listed after the older outcomes, so that the end
    # summary's figures keep their order).
    UNCHANGED = "unchanged"
    # Requests waited for their host's budget (middlewares/host_budget.py): one line per
    # wait episode, naming the host and why; its URL is the first request that waited.
    HOST_WAIT = "host_wait"


OUTCOMES = tuple(Outcome)
# Lines that are not a URL's final outcome: a URL has one final line besides these.
NOT_FINAL = frozenset({Outcome.RETRY, Outcome.ITEM_ERROR, Outcome.HOST_WAIT})
# Fetch attempts that failed (the report groups their errors by host).
FAILED = frozenset({Outcome.RETRY, Outcome.ERROR})
_STATUS = re.compile(r"(?:HTTP )?([1-5]\d\d)\b")
_LIST_LINE = re.compile(r"\S+:\d+: ")
ROBOTS_KIND = "forbidden by robots.txt"
BAD_LINE_KIND = "bad line in the URL list"


def error_kind(error: str | None, status: int | None) -> str:
    """One name per cause of failure, whoever wrote the line (the end summary's
    ``actions/error/<cause>`` counts, the report's problems): ``HTTP 500`` for a
    retry's "500 Internal Server Error" as for the final error, the exception's class
    name without its module, a bad line of the URL list whatever its file."""
    if error:
        head = error.split(":", 1)[0].strip()
        if match := _STATUS.fullmatch(head) or _STATUS.match(error):
            return f"HTTP {match.group(1)}"
        if "robots.txt" in error.lower() and "forbidden" in error.lower():
            return ROBOTS_KIND
        if _LIST_LINE.match(error):
            return BAD_LINE_KIND
        return head.rsplit(".", 1)[-1][:60] or "error"
    return f"HTTP {status}" if status else "unknown"


_encode = json.JSONEncoder(ensure_ascii=False).encode
# What ``_encode`` makes of a cache hit, as a template: a resumed crawl logs tens of
# thousands a second, and the encoder took more of that time than the lookup did.
_CACHE_HIT = (
    '{"ts": "%s", "url": %s, "key": "%s", "attempt": 1, "outcome": "cache_hit", '
    '"status": null, "error": null, "elapsed_ms": null, "bytes": null}\n'
)


class ActionLog:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # The time of day is formatted once a second: a resumed crawl logs tens of
        # thousands of cache hits a second.
        self._second = -1
        self._stamp = ""

    def write(
        self,
        url: str,
        key: str | None,
        outcome: str,
        *,
        attempt: int = 1,
        status: int | None = None,
        error: str | None = None,
        elapsed_ms: float | None = None,
        bytes: int | None = None,
        ts: float | None = None,
        **extra,
    ) -> None:
        """Append one line; ``ts`` is when the attempt ended (default: now)."""
        entry = {
            "ts": self._ts(time.time() if ts is None else ts),
            "url": url,
            "key": key,
            "attempt": attempt,
            "outcome": outcome,
            "status": status,
            "error": error,
            "elapsed_ms": None if elapsed_ms is None else round(elapsed_ms, 1),
            "bytes": bytes,
        }
        if extra:
            entry.update(extra)
        os.write(self._fd, (_encode(entry) + "\n").encode("utf-8"))

    def write_cache_hits(self, hits: list[tuple[str, str]]) -> None:
        """Append a ``cache_hit`` line for each ``(url, key)``, all in one write."""
        if not hits:
            return
        ts = self._ts(time.time())
        text = "".join([_CACHE_HIT % (ts, encode_basestring(url), key) for url, key in hits])
        os.write(self._fd, text.encode("utf-8"))

    def _ts(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((now - second) * 1000):03d}Z"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def repair(path: str | os.PathLike) -> bytes:
    """Cut a torn last line (a kill or a full disk mid-write) so that the next line
    starts on a line of its own; returns what was cut. Call it with no writer."""
    try:
        f = open(path, "r+b")
    except FileNotFoundError:
        return b""
    with f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            chunk = f.read(end - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        if end == size:
            return b""
        f.seek(end)
        torn = f.read()
        f.truncate(end)
        os.fsync(f.fileno())
    return torn


def read(path: str | os.PathLike) -> list[dict]:
    """Every complete line of an action log (a torn last line is skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                out.append(json.loads(line))
    return out


def failed_keys(path: str | os.PathLike, offset: int, keys: Iterable[str]) -> set[str]:
    """The *keys* whose final line past byte *offset* (one run's lines) is ``error``:
    the URLs that run failed after every retry."""
    wanted = set(keys)
    final: dict[str, str] = {}
    try:
        with open(path, "rb") as stream:
            stream.seek(offset)
            for raw in stream:
                try:
                    line = json.loads(raw)
                except ValueError:  # a line cut short by a killed crawl
                    continue
                key, outcome = line.get("key"), line.get("outcome")
                if key in wanted and outcome not in NOT_FINAL:
                    final[key] = outcome
    except FileNotFoundError:
        return set()
    return {key for key, outcome in final.items() if outcome == Outcome.ERROR}
