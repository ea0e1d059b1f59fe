"""Which settings describe a crawl, as redacted text: what ``DATA_DIR/runs.jsonl``
records for each run and what the report shows. No Scrapy: plain ``(name, value)``
pairs in, so that the storage core and the report can both use it."""

from __future__ import annotations

from collections.abc import Iterable

from crawler.redact import redact_url

# These names, and every name with these prefixes.
SETTING_PREFIXES = (
    "DATA_DIR",
    "CATALOG_",
    "ARCHIVE_",
    "PROXY_",
    "HUB_",
    "RENDER_",
    "CONCURRENT_",
    "DOWNLOAD_DELAY",
    "CRAWL_PARTITION",
    "DOWNLOAD_TIMEOUT",
    "AUTOTHROTTLE_",
    "RETRY_",
    "ROBOTSTXT_OBEY",
    "USER_AGENT",
    "DEPTH_LIMIT",
    "CLOSESPIDER_",
)


def crawl_settings(
    items: Iterable[tuple[str, object]], hub_url: str | None = None
) -> dict[str, str]:
    """The crawl-relevant settings as text, credentials redacted (a proxy list or
    ``HUB_URL`` may carry passwords), sorted by name; ``HUB_URL`` as used (it may come
    from the environment)."""
    shown = {
        name: str(value)
        for name, value in items
        if name.startswith(SETTING_PREFIXES) and value is not None  # None: unset
    }
    if hub_url:
        shown["HUB_URL"] = hub_url
    return {name: redact_url(shown[name]) for name in sorted(shown)}
