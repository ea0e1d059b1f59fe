"""What to do about each cause of failure the report names (``crawler.storage.actionlog.error_kind``)."""

from __future__ import annotations

from crawler.storage.actionlog import BAD_LINE_KIND, ROBOTS_KIND

AGAIN = "Not stored, so the next run of the same list tries them again."
SLOW_DOWN = (
    "Slow down for this host: lower CONCURRENT_REQUESTS_PER_DOMAIN or "
    "AUTOTHROTTLE_TARGET_CONCURRENCY, raise DOWNLOAD_DELAY, or spread requests over proxies "
    "(HUB_URL)."
)

# Cause -> advice; HTTP statuses by class below.
ADVICE = {
    ROBOTS_KIND: "The site's robots.txt asks crawlers to keep out of these URLs: they are "
    "not fetched (ROBOTSTXT_OBEY). Drop them from the list, or ask the site.",
    BAD_LINE_KIND: "A line of the URL list is not a URL: the crawl log names its file and "
    "line. Fix or remove it.",
    "HTTP 403": "Refused: the site may block this crawler. Set USER_AGENT to a contact, "
    + SLOW_DOWN,
    "HTTP 404": "Not found: stored as the answer; check the links or the list.",
    "HTTP 407": "The proxy wants credentials: check the proxy URLs (scrapy proxies list).",
    "HTTP 429": "Too many requests. " + SLOW_DOWN,
    "TimeoutError": "No answer within DOWNLOAD_TIMEOUT: the host is slow or overloaded. "
    + SLOW_DOWN
    + " "
    + AGAIN,
    "TCPTimedOutError": "The connection timed out: the host is unreachable or overloaded. " + AGAIN,
    "DNSLookupError": "The host name does not resolve: check it in the URL list, and the "
    "machine's DNS.",
    "ConnectionRefusedError": "Nothing listens on that host and port (the server is down). "
    + AGAIN,
    "DownloadConnectionRefusedError": "Nothing listens on that host and port (the server is "
    "down). " + AGAIN,
    "ResponseNeverReceived": "The connection broke before an answer. " + AGAIN,
    "DownloadCancelledError": "The body is larger than DOWNLOAD_MAXSIZE: raise it (or the "
    "request's download_maxsize) to store such pages.",
}


def advice(kind: str) -> str:
    """One or two sentences: what the cause means and what to do about it."""
    if kind in ADVICE:
        return ADVICE[kind]
    if kind.startswith("HTTP 5"):
        return (
            "The server failed (retried RETRY_TIMES times). "
            + AGAIN
            + " If it lasts, the site is down or refusing this crawler."
        )
    if kind.startswith("HTTP 4"):
        return (
            "The site refused the request: stored as its answer when the status is in "
            "CATALOG_STORE_STATUSES; check the URLs."
        )
    if "timeout" in kind.lower():
        return ADVICE["TimeoutError"]
    return "See the lines with this error in the action log (fetch_log.jsonl)."
