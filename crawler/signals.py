"""Signals of the project (send them with ``crawler.signals.send_catch_log``)."""

from scrapy.http.request import NO_CALLBACK

from crawler.storage.actionlog import NOT_FINAL

# Request meta key: False for a request that is no URL of the crawl's list although a
# start request (a stored page parsed again from the archive at the start).
LISTED_META = "catalog_listed"

# An attempt to record in the action log. Arguments: url, key, outcome, and any of
# attempt, status, error, elapsed_ms, bytes, listed.
action = object()


def listed(request) -> bool:
    """Whether ``request`` is a URL of the crawl's list, whose final outcome is that URL
    done (``progress/list_done``): not a request a callback yielded (it has a depth),
    nor a media pipeline's download (no callback), nor a stored page parsed again."""
    meta = request.meta
    return (
        meta.get("depth", 0) == 0
        and request.callback is not NO_CALLBACK
        and meta.get(LISTED_META, True)
    )


def attempt_fields(request) -> dict:
    """What the action log says of one attempt of ``request`` (url and key as listed),
    and whether it is a URL of the list (``listed``, counted, not logged)."""
    meta = request.meta
    fields = {
        "url": meta.get("catalog_url", request.url),
        "key": meta.get("catalog_key"),
        "listed": listed(request),
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
