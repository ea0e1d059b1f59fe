"""Credentials out of sight: URLs as the crawl may write them.

Everything the crawl writes (logs, stats, the action log, run records, tables that
people list) names a proxy or a database by its redacted URL,
``http://user:***@host:port``. Below every other package of the crawler: the storage,
the hub and the tools all use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

_CREDENTIALS_RE = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<userinfo>[^/@\s]*)@")


def redact_url(url: str) -> str:
    """Return *url* with its password (or a lone user name) replaced by ``***``.

    ``http://user:secret@host:3128`` becomes ``http://user:***@host:3128``; a URL that
    carries only a user name (often an API key) becomes ``http://***@host:3128``.
    Works on malformed URLs too, so that error messages can quote what was given.
    """

    def _sub(match: re.Match[str]) -> str:
        userinfo = match.group("userinfo")
        user, sep, _ = userinfo.partition(":")
        masked = f"{user}:***" if sep else "***"
        return f"{match.group('scheme')}{masked}@"

    return _CREDENTIALS_RE.sub(_sub, url)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret in *text* with ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return redact_url(text)


def url_credentials(url: str) -> tuple[str, str] | None:
    """The (user, password) a URL carries, percent-decoded; None when it has none."""
    parts = urlsplit(url)
    if not parts.username:
        return None
    return unquote(parts.username), unquote(parts.password or "")
