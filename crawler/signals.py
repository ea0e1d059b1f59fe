"""Signals of the project (send them with ``crawler.signals.send_catch_log``)."""

from crawler.storage.actionlog import NOT_FINAL

# An attempt to record in the action log. Arguments: url, key, outcome, and any of
# attempt, status, error, elapsed_ms, bytes, depth.
action = object()


def attempt_fields(request) -> dict:
    """What the action log says of one attempt of ``request`` (url and key as listed)."""
    meta = request.meta
    fields = {
        "url": meta.get("catalog_url", request.url),
        "key": meta.get("catalog_key"),
        "depth": meta.get("depth", 0),
        # Back-off retries (middlewares/retry.py) are attempts too, beside retry_times.
        "attempt": meta.get("retry_times", 0) + meta.get("backoff_times", 0) + 1,
    }
    # The proxy this attempt went through (redacted; set by middlewares/proxy_lease.py),
    # on every line of it, retries and errors included.
    if meta.get("proxy_label"):
        fields["proxy"] = meta["proxy_label"]
    return fields


# Request meta key: the final outcome recorded for this request (absent while none is).
FINAL_OUTCOME = "catalog_outcome"


def mark_final(request, outcome: str) -> None:
    """Note that ``request`` has its outcome line (a retry is not final)."""
    if outcome not in NOT_FINAL:
        request.meta[FINAL_OUTCOME] = outcome


def has_outcome(request) -> bool:
    return FINAL_OUTCOME in request.meta


def send_action(crawler, request, outcome: str, **fields) -> None:
    """Send :data:`action` for one attempt of ``request``."""
    mark_final(request, outcome)
    crawler.signals.send_catch_log(action, outcome=outcome, **attempt_fields(request), **fields)


def short_url(url: str, limit: int = 200) -> str:
    """``url`` cut for a log line: a list may hold URLs of a megabyte."""
    if len(url) <= limit:
        return url
    return f"{url[: limit - 40]}...({len(url):,} characters)"


# The engine started closing the crawl (a signal, CLOSESPIDER, the list's end): whatever
# holds requests back (host gates, proxy waits, back-offs, robots.txt) lets them go
# unsent at once; the next run fetches them. No arguments. Sent by crawler/downloader.py.
crawl_closing = object()

# A job's live settings changed (extensions/job_settings.py). Arguments: settings (every
# setting's value now, a scrapy Settings) and changed (the names that changed). Each
# component that reads one of them takes the new value from here.
live_settings_changed = object()
