"""Proxy URLs checked (the redaction itself is ``crawler/redact.py``)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from crawler.hub.errors import InvalidProxyURLError
from crawler.redact import redact_text, redact_url, url_credentials

__all__ = ["normalize_proxy_url", "redact_text", "redact_url", "url_credentials"]

PROXY_SCHEMES = ("http", "https")


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
