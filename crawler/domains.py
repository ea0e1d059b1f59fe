"""Registered domains (``bbc.co.uk`` for ``www.bbc.co.uk``), from a bundled suffix list."""

from __future__ import annotations

from functools import lru_cache

_extract = None


def _extractor():
    # Loaded on first use: importing tldextract and reading its suffix list takes
    # ~0.2 s, which a list crawl (no links followed) does not need to spend.
    global _extract
    if _extract is None:
        import tldextract

        # The Public Suffix List snapshot shipped with tldextract: no network at run time.
        _extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    return _extract


@lru_cache(maxsize=65536)
def registered_domain(host: str) -> str:
    """The registered domain of ``host``; the host itself for IPs and bare names."""
    host = host.lower().rstrip(".")
    return _extractor()(host).top_domain_under_public_suffix or host
