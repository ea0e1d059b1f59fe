"""Credentials out of sight: URLs as the crawl may write them, proxy URLs checked.

Everything the crawl writes (logs, stats, the action log, tables that people list)
names a proxy or a database by its redacted URL, ``http://user:***@host:port``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

from crawler.hub.errors import InvalidProxyURLError

PROXY_SCHEMES = ("http", "https")

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


def normalize_proxy_url(url: str) -> str:
    """Check a proxy URL and return it in canonical form, or raise InvalidProxyURLError.

    Accepted: ``http://[user[:password]@]host:port`` (or https), nothing after the port.
    """
    text = url.strip()
    shown = redact_url(text)
    if not text:
        raise InvalidProxyURLError("empty proxy URL: give http://[user:password@]host:port")
    if "://" not in text:
        raise InvalidProxyURLError(
            f"proxy URL {shown!r} has no scheme: write it as http://[user:password@]host:port"
        )
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        reason = redact_url(str(exc))
        raise InvalidProxyURLError(
            f"proxy URL {shown!r} is malformed ({reason}): "
            "write it as http://[user:password@]host:port"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in PROXY_SCHEMES:
        raise InvalidProxyURLError(
            f"proxy URL {shown!r} has scheme {scheme!r}: use http:// or https://"
        )
    if not parts.hostname:
        raise InvalidProxyURLError(f"proxy URL {shown!r} has no host: write http://host:port")
    if port is None:
        raise InvalidProxyURLError(f"proxy URL {shown!r} has no port: write http://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidProxyURLError(
            f"proxy URL {shown!r} has a path, query or fragment: a proxy URL ends at the port"
        )
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit((scheme, netloc, "", "", ""))
