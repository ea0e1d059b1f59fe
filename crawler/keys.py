"""The key of a stored artifact.

Rule: ``key = sha256(text).hexdigest()`` where ``text`` is, for a GET request, the
canonical URL alone, and for any other method ``METHOD + " " + canonical URL + "\\n"``
followed by the request body. The canonical URL is w3lib's ``canonicalize_url`` with
fragments dropped: scheme and host lowercased, default port removed, query arguments
sorted, percent-encoding normalised. The key names the request *as listed*, never the
URL a redirect ended at, so a resumed crawl recognises the URLs of its list.
"""

from __future__ import annotations

import hashlib

from w3lib.url import canonicalize_url

_DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def canonical_url(url: str) -> str:
    canon = canonicalize_url(url, keep_fragments=False)
    scheme, sep, rest = canon.partition("://")
    port = _DEFAULT_PORTS.get(scheme)
    if port:
        host, slash, path = rest.partition("/")
        if host.endswith(port):
            canon = f"{scheme}{sep}{host[: -len(port)]}{slash}{path}"
    return canon


def request_key(url: str, method: str = "GET", body: bytes = b"") -> str:
    canon = canonical_url(url).encode("utf-8")
    if method.upper() == "GET":
        return hashlib.sha256(canon).hexdigest()
    h = hashlib.sha256(method.upper().encode("ascii") + b" " + canon + b"\n")
    h.update(body)
    return h.hexdigest()
