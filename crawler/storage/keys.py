"""The key of a stored artifact.

Rule: ``key = sha256(text).hexdigest()`` where ``text`` is, for a GET request, the
canonical URL alone, and for any other method ``METHOD + " " + canonical URL + "\\n"``
followed by the request body. The canonical URL is w3lib's ``canonicalize_url`` with
fragments dropped: scheme and host lowercased, default port removed, query arguments
sorted, percent-encoding normalised. The key names the request *as listed*, never the
URL a redirect ended at, so a resumed crawl recognises the URLs of its list.

A record the crawl makes rather than fetches (an image's thumbnail) has a URL on a
host no crawl can fetch, ``http://thumbs.invalid/<thumb id>/<the image's key>`` (the
``.invalid`` domain never resolves, RFC 6761), and its key is that URL's key: no
fetched URL shares it, SQL finds an image's thumbnails by their URLs, and WARC readers
and replay tools read the record as they read any HTTP response.
"""

from __future__ import annotations

import hashlib
import re

from w3lib.url import canonicalize_url

_DEFAULT_PORTS = {"http": ":80", "https": ":443"}

# URLs that w3lib would return unchanged but for the order of their query arguments:
# lowercase ASCII host, no escapes, no dot segments, no fragment. Most URLs of a crawl
# look like this, and w3lib takes a quarter of what skipping a stored URL costs on
# each (the history of docs/benchmarks.md); tests/test_keys.py checks this path against w3lib.
_SIMPLE_URL = re.compile(
    r"(https?://[a-z0-9-]+(?:\.[a-z0-9-]+)*(?::([1-9][0-9]{0,4}))?)"
    r"(/[A-Za-z0-9._~/-]*)?(?:\?([A-Za-z0-9._~=&-]*))?\Z"
)


def simple_canonical(url: str) -> str | None:
    """The canonical URL of a plain URL (see ``_SIMPLE_URL``), or None for any other."""
    match = _SIMPLE_URL.match(url)
    if match is None:
        return None
    origin, port, path, query = match.groups()
    return _simple(origin, port, path, query)


def _simple(origin: str, port: str | None, path: str | None, query: str | None) -> str | None:
    if port and int(port) > 65535:
        return None  # w3lib refuses it
    if path is None:
        path = "/"
    elif "/." in path:
        return None
    if not query:
        return origin + path
    # (name, "=" or "", value): sorted as w3lib sorts (name, value), since the
    # separator is "" only where the value is "" too.
    pairs = [piece.partition("=") for piece in query.split("&") if piece]
    if not pairs:
        return origin + path
    for _, _, value in pairs:
        if "=" in value:
            return None
    pairs.sort()
    return f"{origin}{path}?" + "&".join([f"{name}={value}" for name, _, value in pairs])


def canonical_url(url: str) -> str:
    canon = simple_canonical(url) or canonicalize_url(url, keep_fragments=False)
    scheme, sep, rest = canon.partition("://")
    port = _DEFAULT_PORTS.get(scheme)
    if port:
        host, slash, path = rest.partition("/")
        if host.endswith(port):
            canon = f"{scheme}{sep}{host[: -len(port)]}{slash}{path}"
    return canon


def plain_key(url: str) -> str | None:
    """``request_key(url)`` (GET) of a plain URL (``_SIMPLE_URL``) that w3lib's
    ``safe_url_string`` (what ``scrapy.Request`` does to its URL) keeps as it is, or
    None for any other: the cheap path of a resumed crawl, which keys every listed URL."""
    match = _SIMPLE_URL.match(url)
    if match is None:
        return None
    origin, port, path, query = match.groups()
    if query is not None and (path is None or not query):
        return None  # safe_url_string adds a "/" before the "?", or drops a last "?"
    if port is None and path is not None and "/." not in path:
        if query is None or _in_order(query):
            return hashlib.sha256(url.encode()).hexdigest()  # canonical as it is
    elif port is not None and _DEFAULT_PORTS[origin[: origin.index(":")]] == ":" + port:
        origin = origin[: -len(port) - 1]
    canon = _simple(origin, port, path, query)
    if canon is None:
        return None
    return hashlib.sha256(canon.encode()).hexdigest()


def _in_order(query: str) -> bool:
    """Whether a plain query is canonical as it is: one or two ``name=value`` in the
    order w3lib sorts them (most listed URLs; any other goes through ``_simple``)."""
    if "&" not in query:
        return query.count("=") == 1
    first, _, second = query.partition("&")
    return (
        query.count("=") == 2
        and "=" in first
        and "=" in second
        and "&" not in second
        and first.partition("=") <= second.partition("=")
    )


def request_key(url: str, method: str = "GET", body: bytes = b"") -> str:
    canon = canonical_url(url).encode("utf-8")
    if method.upper() == "GET":
        return hashlib.sha256(canon).hexdigest()
    h = hashlib.sha256(method.upper().encode("ascii") + b" " + canon + b"\n")
    h.update(body)
    return h.hexdigest()


# Where thumbnails' URLs start (see the module's docstring).
THUMB_PREFIX = "http://thumbs.invalid/"


def thumb_url(image_key: str, thumb_id: str) -> str:
    """The URL of thumbnail ``thumb_id`` of the image stored under ``image_key``."""
    return f"{THUMB_PREFIX}{thumb_id}/{image_key}"


def thumb_key(image_key: str, thumb_id: str) -> str:
    """The catalog key of thumbnail ``thumb_id`` of the image stored under ``image_key``."""
    return request_key(thumb_url(image_key, thumb_id))
