"""What to do about each cause of failure the report names
(``crawler.storage.actionlog.error_kind``). Whether the URLs it failed are stored now
is said beside it, from the catalog (``model.fate_text``)."""

from __future__ import annotations

from crawler.storage.actionlog import BAD_LINE_KIND, ROBOTS_KIND

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
    "HTTP 404": "Not found, and 404 is not in CATALOG_STORE_STATUSES, so the answer is not "
    "stored: check the links or the list.",
    "HTTP 407": "The proxy wants credentials: check the proxy URLs (scrapy proxies list).",
    "HTTP 429": "Too many requests. " + SLOW_DOWN,
    "TimeoutError": "No answer within DOWNLOAD_TIMEOUT: the host is slow or overloaded. "
    + SLOW_DOWN,
    "TCPTimedOutError": "The connection timed out: the host is unreachable or overloaded.",
    "DNSLookupError": "The host name does not resolve: check it in the URL list, and the "
    "machine's DNS.",
    "ConnectionRefusedError": "Nothing listens on that host and port (the server is down).",
    "DownloadConnectionRefusedError": "Nothing listens on that host and port (the server is down).",
    "ResponseNeverReceived": "The connection broke before an answer.",
    "DownloadCancelledError": "The body is larger than DOWNLOAD_MAXSIZE: raise it (or the "
    "request's download_maxsize) to store such pages.",
}


def advice(kind: str) -> str:
    """One or two sentences: what the cause means and what to do about it."""
    if kind in ADVICE:
        return ADVICE[kind]
    if kind.startswith("HTTP 5"):
        return (
            "The server failed; a failed attempt is retried up to RETRY_TIMES times. If it "
            "lasts, the site is down or refusing this crawler."
        )
    if kind.startswith("HTTP 4"):
        return (
            "The site refused the request, and the status is not in "
            "CATALOG_STORE_STATUSES, so the answer is not stored: check the URLs."
        )
    if "timeout" in kind.lower():
        return ADVICE["TimeoutError"]
    return "See the lines with this error in the action log (fetch_log.jsonl)."
