"""Registered domains (``bbc.co.uk`` for ``www.bbc.co.uk``), from a bundled suffix list."""

from __future__ import annotations

from functools import lru_cache

import tldextract

# The Public Suffix List snapshot shipped with tldextract: no network at run time.
_extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@lru_cache(maxsize=65536)
def registered_domain(host: str) -> str:
    """The registered domain of ``host``; the host itself for IPs and bare names."""
    host = host.lower().rstrip(".")
    return _extract(host).top_domain_under_public_suffix or host
