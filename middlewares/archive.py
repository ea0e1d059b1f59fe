"""Stores every response the crawl receives, and skips what is already stored.

``ArchiveMiddleware`` is the Scrapy side of a :class:`~crawler.storage.session.StorageSession`
(which does the storing). It sits at the outer end of the downloader middlewares
(after redirects, retries and decompression have happened), so it sees each request
once on its way out and its final answer once on the way back:

- on the way out, a request whose key is in the catalog is not sent: it is logged as
  a ``cache_hit`` and dropped, or answered from the archive when its meta asks for
  ``catalog_replay`` (a depth crawl needs the links of stored pages), or sent with
  validators when the spider revalidates;
- on the way back, final answers are handed to the archive writer process, 304s
  refresh their row, and everything else is logged as an error (no row, so the next
  run tries again).

Request meta keys: ``catalog_key`` (computed if absent), ``catalog_replay``,
``catalog_revalidate`` (or the spider attribute ``revalidate``), and
``render_source``: set by a downloader that hands the spider something other than
what the server sent (a browser hands over the DOM it rendered). It holds the
server's answer as plain data (``url``, ``status``, ``headers``, ``body``,
``request_headers``), or None when none was captured; that answer is stored as the
response and the response's body as what was rendered from it.

A request for a key this run is still fetching or storing waits for its row
(``crawler/storage/unsettled.py``), so that a URL is fetched once. (Over 400 lines:
storing and skipping are one component's two sides of the same request.)
"""

from __future__ import annotations

import logging
import time

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured, UsageError
from scrapy.http import Response, TextResponse
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet import task

from crawler import signals as crawler_signals
from crawler.hub.db import hub_url
from crawler.reparse.responses import build_response
from crawler.runsettings import crawl_settings
from crawler.signals import attempt_fields
from crawler.storage.actionlog import OUTCOMES
from crawler.storage.errors import CatalogError, SettingError, StoreError
from crawler.storage.keys import request_key
from crawler.storage.records import ORIG_PREFIX, Fetch, Headers, Hop
from crawler.storage.session import SessionConfig, StorageSession
from crawler.storage.unsettled import UnsettledKeys

logger = logging.getLogger(__name__)
# How often counts kept by the middleware reach the stats.
COUNTS_SECONDS = 1.0
# How often a request waiting for its key's row asks the catalog.
SETTLE_POLL_SECONDS = 0.2

CACHED_FLAG = "cached"
SOURCE_META = "render_source"
HIDDEN_REQUEST_HEADERS = frozenset({"proxy-authorization", "authorization"})
HIDDEN_HEADERS = frozenset(name.encode() for name in HIDDEN_REQUEST_HEADERS)
# Request meta key: the redirects followed so far (middlewares/redirect_hops.py).
HOPS_META = "archive_hops"


class CachedRequest(IgnoreRequest):
    """The request's answer is already stored."""


def _is_robots(request: Request) -> bool:
    return request.meta.get("dont_obey_robotstxt") and request.url.endswith("/robots.txt")


def header_list(headers, hidden: frozenset[bytes] = frozenset()) -> Headers:
    """Scrapy headers as the archive keeps them, without the ``hidden`` ones."""
    # dict.items: Scrapy's Headers.items() normalises every key and value again, which
    # cost more than everything else the middleware does per response.
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, values in dict.items(headers)
        if name.lower() not in hidden
        for value in values
    ]


def hops_before(request: Request, response: Response) -> list[Hop]:
    """The redirects followed to reach ``response`` (middlewares/redirect_hops.py),
    not ``response`` itself, which may be a redirect the crawl did not follow."""
    hops = request.meta.get(HOPS_META, [])
    if hops and hops[-1].url == response.url and hops[-1].status == response.status:
        return hops[:-1]
    return list(hops)


def response_fetch(key: str, request: Request, response: Response) -> Fetch:
    """What the archive stores of a response."""
    meta = request.meta
    if SOURCE_META in meta:
        return captured_fetch(key, request, response, meta[SOURCE_META])
    return Fetch(
        key=key,
        url=meta.get("catalog_url", request.url),
        final_url=response.url,
        method=request.method,
        request_headers=header_list(request.headers, HIDDEN_HEADERS),
        request_body=request.body,
        status=response.status,
        response_headers=header_list(response.headers),
        body=response.body,
        redirects=hops_before(request, response),
    )


def captured_fetch(key: str, request: Request, response: Response, source: dict | None) -> Fetch:
    """A response made from a server's answer (``source``, see the module's docstring):
    that answer, and the response's body as what was rendered from it."""
    rendered = response.body
    if isinstance(response, TextResponse):
        rendered_type = f"text/html; charset={response.encoding}"
    else:
        rendered_type = response.headers.get("Content-Type", b"text/html").decode("latin-1")
    if source is None:  # nothing captured: store the rendered body as the answer
        source = {"url": response.url, "status": response.status, "body": rendered}
        source["headers"] = [("Content-Type", rendered_type)]
        source["request_headers"] = []
        rendered = None
    return Fetch(
        key=key,
        url=request.meta.get("catalog_url", request.url),
        final_url=source["url"],
        method=request.method,
        request_headers=[
            (n, v) for n, v in source["request_headers"] if n.lower() not in HIDDEN_REQUEST_HEADERS
        ],
        request_body=request.body,
        status=source["status"],
        # The body was handed over decoded, as Scrapy does.
        response_headers=[
            (ORIG_PREFIX + n if n.lower() == "content-encoding" else n, v)
            for n, v in source["headers"]
        ],
        body=source["body"],
        rendered_body=rendered,
        rendered_type=rendered_type,
    )


class ArchiveMiddleware:
    def __init__(self, crawler):
        if not crawler.settings.getbool("ARCHIVE_ENABLED", True):
            raise NotConfigured("ARCHIVE_ENABLED is off")
        self.crawler = crawler
        self.stats = crawler.stats
        # Per-response counts are kept here and added to the stats once a second (and
        # at the end): Scrapy's stats collector hooks every attribute access, which
        # cost more per response than counting here (README: Benchmarks).
        self._counts: dict[str, int] = {}
        self._pusher = task.LoopingCall(self._push_counts)
        try:
            self.config = SessionConfig.from_settings(crawler.settings)
        except SettingError as exc:
            # A usage error: `scrapy crawl` prints its one line and exits 2.
            raise UsageError(str(exc)) from None
        self.session = StorageSession(self.config)
        # What runs.jsonl records of this run, as plain text: the storage core takes
        # no Scrapy settings.
        self.run_settings = crawl_settings(
            crawler.settings.copy_to_dict().items(), hub_url(crawler.settings)
        )
        # Started now, so that it loads while Scrapy starts up; it opens the store in
        # spider_opened, once the data directory is recovered.
        self.session.start_writer()
        self.revalidate = False
        # Keys fetched or stored by this run but not yet committed: a request for one
        # waits for its row (a commit comes at least every CATALOG_FLUSH_SECONDS).
        self._unsettled = UnsettledKeys()
        self._settle_seconds = 2 * self.config.store.flush_seconds + 10
        self._failed = False
        self._log_failed = False
        self._storing = False  # the writer has opened the store

    @classmethod
    def from_crawler(cls, crawler):
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(mw._on_action_signal, signal=crawler_signals.action)
        return mw

    # -- life cycle ----------------------------------------------------------------

    def spider_opened(self, spider) -> None:
        self.revalidate = bool(getattr(spider, "revalidate", False))
        datadir = self.session.datadir
        try:
            recovery = self.session.open(spider.name, self.run_settings)
        except (StoreError, CatalogError, OSError) as exc:
            self._fail(f"cannot open the data directory {datadir.root}: {exc}")
            return
        if recovery.indexed_rows:
            self.stats.set_value("catalog/recovered_rows", recovery.indexed_rows)
        self._storing = True
        self._pusher.start(COUNTS_SECONDS, now=False)
        logger.info("Storing in %s (catalog %s)", datadir.root, datadir.catalog_path)

    def spider_closed(self, spider=None, reason: str = "finished") -> None:
        self.close_storage()

    def close_storage(self) -> None:
        """Drain the writer, commit, release the data directory; log the summary."""
        if self._pusher.running:
            self._pusher.stop()
        self._push_counts()
        self._storing = False
        logger.info("%s", self._outcomes())
        try:
            summary = self.session.close()
        except StoreError as exc:
            self._fail(f"The archive writer failed: {exc}")
            summary = None
        if summary:
            self.stats.set_value("catalog/rows_committed", summary["rows_committed"])
            # What storing cost besides the crawl's own process (benchmarks read it).
            self.stats.set_value("archive/writer_cpu_seconds", round(summary["cpu_seconds"], 3))
            logger.info("%s", self.session.summary(summary).text())

    def _outcomes(self) -> str:
        get = self.stats.get_value
        counts = ", ".join(f"{get(f'actions/{outcome}', 0):,} {outcome}" for outcome in OUTCOMES)
        total = get("progress/list_total")
        done = f"{get('progress/list_done', 0):,}" + (f" of {total:,}" if total else "")
        return f"Outcomes of this run: {counts}; listed URLs done: {done}."

    def _fail(self, message: str) -> None:
        """Log a storage failure once; the crawl stops and exits 1 (``archive/error``)."""
        if self._failed:
            return
        self._failed = True
        logger.error("%s", message)
        self.stats.set_value("archive/error", message)
        engine = self.crawler.engine
        if engine is not None and engine.spider is not None and engine.running:
            deferred_from_coro(engine.close_spider_async(reason="storage_error"))

    # -- the action log -------------------------------------------------------------

    def _on_action_signal(self, signal=None, sender=None, **kwargs) -> None:
        self.record_action(**kwargs)

    def record_action(
        self, url: str, key: str | None, outcome: str, depth: int = 0, **fields
    ) -> None:
        self._count(outcome, depth)
        log = self.session.log
        if log is not None and not self._log_failed:
            try:
                log.write(url, key, outcome, **fields)
            except OSError as exc:
                self._log_failure(exc)

    def _log_failure(self, exc: OSError) -> None:
        # One message, then no more writes: a full disk would fail every one of them.
        self._log_failed = True
        self._fail(
            f"writing the action log {self.session.datadir.action_log_path} failed: "
            f"{exc.strerror or exc}; rows committed so far are intact, the next run "
            "repairs the log and resumes"
        )

    def _inc(self, name: str, count: int = 1) -> None:
        counts = self._counts
        counts[name] = counts.get(name, 0) + count

    def _push_counts(self) -> None:
        counts, self._counts = self._counts, {}
        for name, count in counts.items():
            self.stats.inc_value(name, count)
        if self._storing:
            try:
                self.session.check()
            except StoreError as exc:
                self._fail(f"The archive writer failed: {exc}")

    def _count(self, outcome: str, depth: int) -> None:
        self._inc(f"actions/{outcome}")
        if outcome != "retry" and depth == 0:
            self._inc("progress/list_done")

    def _fields(self, request: Request, **fields) -> dict:
        meta = request.meta
        if "download_latency" in meta and "elapsed_ms" not in fields:
            fields["elapsed_ms"] = meta["download_latency"] * 1000
        if meta.get("proxy_label"):
            fields["proxy"] = meta["proxy_label"]
        return {**attempt_fields(request), **fields}

    def _record(self, request: Request, outcome: str, **fields) -> None:
        crawler_signals.mark_final(request, outcome)
        self.record_action(outcome=outcome, **self._fields(request, **fields))

    # -- keys and the start-request fast path ---------------------------------------

    def key_for(self, request: Request) -> str:
        meta = request.meta
        key = meta.get("catalog_key")
        if key is None:
            key = request_key(request.url, request.method, request.body)
            meta["catalog_key"] = key
            meta["catalog_url"] = request.url
        return key

    def filter_start(self, requests: list[Request]) -> list[Request]:
        """Drop the stored ones among a batch of start requests, with one query
        (those checked already, by ``crawler.spiderkit.start``, pass as they are)."""
        if self.session.catalog is None:
            return requests
        unchecked = [r for r in requests if not r.meta.get("catalog_checked")]
        if not unchecked:
            return requests
        present = self.session.present([self.key_for(r) for r in unchecked])
        out = []
        hits = []
        for request in requests:
            meta = request.meta
            if meta.get("catalog_checked"):
                out.append(request)
                continue
            key = meta["catalog_key"]
            meta["catalog_checked"] = True
            meta["catalog_cached"] = cached = key in present
            if cached and not self._wants_fetch_when_cached(request):
                # The hot path of a resumed crawl: logged and counted once per batch.
                hits.append((meta.get("catalog_url", request.url), key))
            else:
                out.append(request)
        self._cache_hits(hits)
        return out

    def skip_stored(self, listed: list[tuple[str, str]]) -> set[str] | None:
        """Of a batch of listed ``(url, key)`` (the URL and key of the GET request a
        spider would build), the keys that are stored: logged as cache hits and
        counted here, so that no request is built for them. None when nothing may be
        skipped here (no catalog open, or the crawl revalidates): build them all."""
        if self.session.catalog is None or self.revalidate:
            return None
        present = self.session.present([key for _, key in listed])
        if present:
            self._cache_hits([(url, key) for url, key in listed if key in present])
        return present

    def _cache_hits(self, hits: list[tuple[str, str]]) -> None:
        if not hits:
            return
        if not self._log_failed:
            try:
                self.session.log.write_cache_hits(hits)
            except OSError as exc:
                self._log_failure(exc)
        for name in ("catalog/cache_hits", "actions/cache_hit", "progress/list_done"):
            self._inc(name, len(hits))

    def _wants_fetch_when_cached(self, request: Request) -> bool:
        meta = request.meta
        return bool(meta.get("catalog_replay") or meta.get("catalog_revalidate", self.revalidate))

    # -- downloader middleware -------------------------------------------------------

    def process_request(self, request: Request) -> Response | None:
        if self.session.catalog is None or _is_robots(request):
            return None
        meta = request.meta
        key = self.key_for(request)
        # The request passed the dupefilter already; where it redirects must be fetched
        # too, even if another request fetched that URL, or its key never gets a row.
        request.dont_filter = True
        if meta.get("catalog_checked") and not meta.get("catalog_cached"):
            self._unsettled.fetching(key)  # checked in a batch, or a redirect or retry
            return None
        if meta.get("catalog_revalidating"):
            return None  # a redirect or retry of a revalidation
        row = self.session.lookup(key)
        if row is None and key in self._unsettled:
            return self._when_settled(request, key)
        return self._answer(request, key, row)

    async def _when_settled(self, request: Request, key: str) -> Response | None:
        """Wait for the row of a key this run is fetching or storing, then answer as
        for a stored one; fetch when its fetch stored nothing, or after a while."""
        from twisted.internet import reactor

        self.stats.inc_value("catalog/waits_for_writer")
        deadline = time.monotonic() + self._settle_seconds
        row = None
        while row is None and key in self._unsettled and time.monotonic() < deadline:
            await maybe_deferred_to_future(task.deferLater(reactor, SETTLE_POLL_SECONDS))
            if self.session.catalog is None:
                break
            row = self.session.lookup(key)
        return self._answer(request, key, row)

    def _answer(self, request: Request, key: str, row) -> Response | None:
        meta = request.meta
        meta["catalog_checked"] = True
        meta["catalog_cached"] = row is not None
        if row is None:
            self._unsettled.fetching(key)
            return None
        if meta.get("catalog_revalidate", self.revalidate):
            if not (row.etag or row.last_modified):
                return None  # no validators: fetch it again
            if row.etag:
                request.headers["If-None-Match"] = row.etag
            if row.last_modified:
                request.headers["If-Modified-Since"] = row.last_modified
            meta["catalog_revalidating"] = True
            meta["catalog_row"] = row
            return None
        self.stats.inc_value("catalog/cache_hits")
        if meta.get("catalog_replay"):
            response = self._replay(request, row)
            if response is not None:
                self._record(request, "cache_hit")
                return response
            return None
        self._record(request, "cache_hit")
        raise CachedRequest(f"already stored: {request.url}")

    def _replay(self, request: Request, row) -> Response | None:
        stored = self.session.replay(row)
        if stored is None:  # unreadable: fetched again
            self.stats.inc_value("archive/read_errors")
            return None
        self.stats.inc_value("archive/replayed")
        return build_response(stored, request, flags=[CACHED_FLAG])

    def process_response(self, request: Request, response: Response) -> Response:
        if not self._storing or _is_robots(request) or CACHED_FLAG in response.flags:
            return response
        meta = request.meta
        status = response.status
        if status == 304 and meta.get("catalog_revalidating"):
            return self._not_modified(request, response)
        if status not in self.config.store_statuses:
            self._unsettled.failed(self.key_for(request))
            self._record(request, "error", status=status, error=f"HTTP {status}")
            return response
        fetch = response_fetch(self.key_for(request), request, response)
        size = len(fetch.body)
        # The writer process writes the "ok" line once the records are written.
        action = self._fields(request, outcome="ok", status=status, bytes=size, ts=time.time())
        depth = action.pop("depth")
        try:
            self.session.put(fetch, action)
        except StoreError as exc:
            self._record(request, "error", status=status, error=f"not stored: {exc}")
            self._fail(str(exc))
            return response
        crawler_signals.mark_final(request, "ok")
        self._unsettled.stored(fetch.key)
        self._inc("archive/stored")
        self._inc("archive/stored_bytes", size)
        self._count("ok", depth)
        return response

    def _not_modified(self, request: Request, response: Response) -> Response:
        row = request.meta.get("catalog_row")
        fetch = response_fetch(self.key_for(request), request, response)
        try:
            self.session.touch(fetch, row.fetched_at if row else None)
        except StoreError as exc:
            self._fail(str(exc))
            return response
        self.stats.inc_value("catalog/not_modified")
        self._record(request, "not_modified", status=304, bytes=0)
        if request.meta.get("catalog_replay") and row is not None:
            return self._replay(request, row) or response
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if self.session.log is None or isinstance(exception, CachedRequest) or _is_robots(request):
            return None
        if isinstance(exception, IgnoreRequest):
            error = str(exception) or "ignored"
        else:
            error = f"{type(exception).__name__}: {exception}"
        self._unsettled.failed(self.key_for(request))
        self._record(request, "error", error=error)
        return None
