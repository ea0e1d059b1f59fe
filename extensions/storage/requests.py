"""What the storage side notes on a request's meta, and the exception of a stored one.

``catalog_key`` and ``catalog_url``: the request's key and the URL it was listed as
(computed once); ``catalog_checked`` and ``catalog_cached``: it was looked up, and
whether it was stored (one not stored is not looked up again).
"""

from __future__ import annotations

from scrapy import Request
from scrapy.exceptions import IgnoreRequest

from crawler.storage.keys import request_key

# Response flag of an answer replayed from the archive.
CACHED_FLAG = "cached"


class CachedRequest(IgnoreRequest):
    """The request's answer is already stored."""


def catalog_key(request: Request) -> str:
    """The request's catalog key, kept on its meta with the URL it was listed as."""
    meta = request.meta
    key = meta.get("catalog_key")
    if key is None:
        key = meta["catalog_key"] = request_key(request.url, request.method, request.body)
        meta["catalog_url"] = request.url
    return key


def looked_up(request: Request, stored: bool) -> None:
    """Note on ``request`` that its key was looked up (``catalog_checked``) and whether
    it was stored (``catalog_cached``): one not stored is not looked up again."""
    request.meta["catalog_checked"] = True
    request.meta["catalog_cached"] = stored


def unstored(request: Request) -> bool:
    """Whether ``request`` was looked up and found not stored (see :func:`looked_up`)."""
    meta = request.meta
    return bool(meta.get("catalog_checked")) and not meta.get("catalog_cached")
