"""Stores every response the crawl receives, and skips what is already stored.

``ArchiveMiddleware`` sits at the outer end of the downloader middlewares (after
redirects, retries and decompression have happened), so it sees each request once on
its way out and its final answer once on the way back:

- on the way out, a request whose key is in the catalog is not sent: it is logged as
  a ``cache_hit`` and dropped, or answered from the archive when its meta asks for
  ``catalog_replay`` (a depth crawl needs the links of stored pages), or sent with
  validators when the spider revalidates;
- on the way back, final answers are handed to the archive writer process, 304s
  refresh their row, and everything else is logged as an error (no row, so the next
  run tries again).

Request meta keys: ``catalog_key`` (computed if absent), ``catalog_replay``,
``catalog_revalidate`` (or the spider attribute ``revalidate``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro
from twisted.internet import task

from crawler import signals as crawler_signals
from crawler.actionlog import ActionLog
from crawler.archive import MAX_LEVEL, ArchiveError, Fetch, read_any, resolve
from crawler.catalog import Catalog, CatalogError
from crawler.keys import request_key
from crawler.responses import build_response
from crawler.seen import with_seen
from crawler.signals import attempt_fields
from crawler.store import DataDirLock, StoreConfig, StoreError, WriterProcess, recover
from middlewares.render import rendered_fetch

logger = logging.getLogger(__name__)
# How often counts kept by the middleware reach the stats.
COUNTS_SECONDS = 1.0

CACHED_FLAG = "cached"
_HIDDEN_REQUEST_HEADERS = {b"proxy-authorization", b"authorization"}


class CachedRequest(IgnoreRequest):
    """The request's answer is already stored."""


@dataclass
class StorageSettings:
    data_dir: Path
    store_statuses: frozenset[int]
    queue_bytes: int
    store: StoreConfig

    @classmethod
    def from_settings(cls, settings) -> StorageSettings:
        data_dir = Path(settings.get("DATA_DIR") or "data")
        batch_size = settings.getint("CATALOG_BATCH_SIZE")
        if batch_size < 1:
            raise ValueError(f"CATALOG_BATCH_SIZE must be at least 1, not {batch_size}")
        compressor = settings.get("ARCHIVE_COMPRESSOR") or "isal"
        if compressor not in MAX_LEVEL:
            raise ValueError(
                f"ARCHIVE_COMPRESSOR must be one of {sorted(MAX_LEVEL)}, not {compressor!r}"
            )
        level = settings.getint("ARCHIVE_GZIP_LEVEL")
        if not 0 <= level <= MAX_LEVEL[compressor]:
            raise ValueError(
                f"ARCHIVE_GZIP_LEVEL must be 0-{MAX_LEVEL[compressor]} with "
                f"ARCHIVE_COMPRESSOR={compressor}, not {level}"
            )
        return cls(
            data_dir=data_dir,
            store_statuses=frozenset(int(s) for s in settings.getlist("CATALOG_STORE_STATUSES")),
            queue_bytes=settings.getint("ARCHIVE_QUEUE_BYTES"),
            store=StoreConfig(
                data_dir=data_dir,
                prefix=settings.get("ARCHIVE_PREFIX") or "crawl",
                rollover_bytes=settings.getint("ARCHIVE_ROLLOVER_BYTES"),
                gzip_level=level,
                compressor=compressor,
                batch_size=batch_size,
                flush_seconds=settings.getfloat("CATALOG_FLUSH_SECONDS"),
                rollover_seconds=settings.getfloat("ARCHIVE_ROLLOVER_SECONDS"),
                format=archive_format(settings),
            ),
        )


def archive_format(settings) -> str:
    fmt = (settings.get("ARCHIVE_FORMAT") or "warc").lower()
    if fmt not in ("warc", "zip"):
        raise ValueError(f"ARCHIVE_FORMAT must be warc or zip, not {fmt!r}")
    return fmt


def _is_robots(request: Request) -> bool:
    return request.meta.get("dont_obey_robotstxt") and request.url.endswith("/robots.txt")


def _headers(headers, hidden: set[bytes] = frozenset()) -> list[tuple[str, str]]:
    # dict.items: Scrapy's Headers.items() normalises every key and value again, which
    # cost more than everything else the middleware does per response.
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, values in dict.items(headers)
        if name.lower() not in hidden
        for value in values
    ]


class ArchiveMiddleware:
    def __init__(self, crawler):
        if not crawler.settings.getbool("ARCHIVE_ENABLED", True):
            raise NotConfigured("ARCHIVE_ENABLED is off")
        self.crawler = crawler
        self.stats = crawler.stats
        # Per-response counts are kept here and added to the stats once a second (and
        # at the end): Scrapy's stats collector hooks every attribute access, and four
        # counts a response cost it ~20 us on the crawl's thread.
        self._counts: dict[str, int] = {}
        self._pusher = task.LoopingCall(self._push_counts)
        self.config = StorageSettings.from_settings(crawler.settings)
        self.seen_patterns = crawler.settings.getlist("CATALOG_SEEN")
        self.revalidate = False
        self.catalog: Catalog | None = None
        # Started now, so that it loads while Scrapy starts up; it opens the store in
        # spider_opened, once the data directory is recovered.
        self.writer: WriterProcess | None = WriterProcess(queue_bytes=self.config.queue_bytes)
        self.log: ActionLog | None = None
        self._lock = DataDirLock(self.config.store.lock_path)
        self._failed = False
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
        config = self.config.store
        try:
            self._lock.acquire()
            recovery = recover(config)
            for repair in recovery.repairs:
                logger.warning(
                    "Repaired %s left open by a killed run: %d records kept, %d bytes cut%s",
                    repair.path,
                    repair.records,
                    repair.cut_bytes,
                    f" (saved in {repair.cut_file})" if repair.cut_file else "",
                )
            if recovery.indexed_rows:
                logger.warning(
                    "Indexed %d stored records the catalog lacked", recovery.indexed_rows
                )
                self.stats.set_value("catalog/recovered_rows", recovery.indexed_rows)
            Catalog(config.catalog_path).close()  # creates or migrates it
            self.catalog = with_seen(
                Catalog(config.catalog_path, readonly=True), self.seen_patterns
            )
            self.log = ActionLog(config.action_log_path)
            self.writer.open(config)
        except (StoreError, CatalogError, OSError) as exc:
            self._fail(f"cannot open the data directory {config.data_dir}: {exc}")
            return
        self._storing = True
        self._pusher.start(COUNTS_SECONDS, now=False)
        logger.info("Storing in %s (catalog %s)", config.data_dir, config.catalog_path)

    def spider_closed(self, spider, reason) -> None:
        if self._pusher.running:
            self._pusher.stop()
        self._push_counts()
        summary = None
        self._storing = False
        if self.writer is not None:
            try:
                summary = self.writer.close()
            except StoreError as exc:
                logger.error("The archive writer failed: %s", exc)
            self.writer = None
        if summary:
            self.stats.set_value("catalog/rows_committed", summary["rows_committed"])
            # What storing cost besides the crawl's own process (benchmarks read it).
            self.stats.set_value("archive/writer_cpu_seconds", round(summary["cpu_seconds"], 3))
            self._log_summary(summary)
        if self.catalog is not None:
            self.catalog.close()
            self.catalog = None
        if self.log is not None:
            self.log.close()
        self._lock.release()

    def _log_summary(self, summary: dict) -> None:
        config = self.config.store
        with Catalog(config.catalog_path, readonly=True) as catalog:
            totals = catalog.summary()
        archive_bytes = sum(p.stat().st_size for p in config.archive_dir.glob("*.warc.gz*"))
        by_status = ", ".join(f"{s}: {n}" for s, n in totals["by_status"].items()) or "none"
        logger.info(
            "This run stored %d responses (%s bytes) and refreshed %d.\n"
            "Catalog %s: %d rows (%s), %s bytes of bodies.\n"
            "Archive %s: %.1f MB in %d files. Action log: %s",
            summary["stored"],
            f"{summary['bytes']:,}",
            summary["refreshed"],
            config.catalog_path,
            totals["rows"],
            by_status,
            f"{totals['bytes']:,}",
            config.archive_dir,
            archive_bytes / 1e6,
            len(list(config.archive_dir.glob("*.warc.gz"))),
            config.action_log_path,
        )

    def _fail(self, message: str) -> None:
        if self._failed:
            return
        self._failed = True
        logger.error("%s", message)
        self.stats.set_value("archive/error", message)
        deferred_from_coro(self.crawler.engine.close_spider_async(reason="storage_error"))

    # -- the action log -------------------------------------------------------------

    def _on_action_signal(self, signal=None, sender=None, **kwargs) -> None:
        self.record_action(**kwargs)

    def record_action(
        self, url: str, key: str | None, outcome: str, depth: int = 0, **fields
    ) -> None:
        self._count(outcome, depth)
        if self.log is not None:
            self.log.write(url, key, outcome, **fields)

    def _inc(self, name: str, count: int = 1) -> None:
        counts = self._counts
        counts[name] = counts.get(name, 0) + count

    def _push_counts(self) -> None:
        counts, self._counts = self._counts, {}
        for name, count in counts.items():
            self.stats.inc_value(name, count)

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
        """Drop the stored ones among a batch of start requests, with one query."""
        if self.catalog is None:
            return requests
        keys = [self.key_for(r) for r in requests]
        present = self.catalog.present(keys)
        out = []
        hits = []
        for request, key in zip(requests, keys, strict=True):
            meta = request.meta
            meta["catalog_checked"] = True
            meta["catalog_cached"] = cached = key in present
            if cached and not self._wants_fetch_when_cached(request):
                # The hot path of a resumed crawl: logged and counted once per batch.
                hits.append((meta["catalog_url"], key))
            else:
                out.append(request)
        if hits:
            self.log.write_cache_hits(hits)
            for name in ("catalog/cache_hits", "actions/cache_hit", "progress/list_done"):
                self._inc(name, len(hits))
        return out

    def _wants_fetch_when_cached(self, request: Request) -> bool:
        meta = request.meta
        return bool(meta.get("catalog_replay") or meta.get("catalog_revalidate", self.revalidate))

    # -- downloader middleware -------------------------------------------------------

    def process_request(self, request: Request) -> Response | None:
        if self.catalog is None or _is_robots(request):
            return None
        meta = request.meta
        key = self.key_for(request)
        # The request passed the dupefilter already; where it redirects must be fetched
        # too, even if another request fetched that URL, or its key never gets a row.
        request.dont_filter = True
        if meta.get("catalog_checked") and not meta.get("catalog_cached"):
            return None
        if meta.get("catalog_revalidating"):
            return None  # a redirect or retry of a revalidation
        row = self.catalog.get(key)
        meta["catalog_checked"] = True
        meta["catalog_cached"] = row is not None
        if row is None:
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
        try:
            stored = read_any(resolve(self.config.data_dir, row.archive), row.offset, row.length)
        except (ArchiveError, OSError) as exc:
            logger.warning("Stored copy of %s unreadable, fetching it again: %s", request.url, exc)
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
            self._record(request, "error", status=status, error=f"HTTP {status}")
            return response
        fetch = self._fetch(request, response)
        size = len(fetch.body)
        # The writer process writes the "ok" line once the records are written.
        action = self._fields(request, outcome="ok", status=status, bytes=size, ts=time.time())
        depth = action.pop("depth")
        try:
            self.writer.put(fetch, action)
        except StoreError as exc:
            self._record(request, "error", status=status, error=f"not stored: {exc}")
            self._fail(str(exc))
            return response
        self._inc("archive/stored")
        self._inc("archive/stored_bytes", size)
        self._count("ok", depth)
        return response

    def _not_modified(self, request: Request, response: Response) -> Response:
        row = request.meta.get("catalog_row")
        try:
            self.writer.touch(self._fetch(request, response), row.fetched_at if row else None)
        except StoreError as exc:
            self._fail(str(exc))
            return response
        self.stats.inc_value("catalog/not_modified")
        self._record(request, "not_modified", status=304, bytes=0)
        if request.meta.get("catalog_replay") and row is not None:
            return self._replay(request, row) or response
        return response

    def _fetch(self, request: Request, response: Response) -> Fetch:
        meta = request.meta
        if "render_source" in meta:
            return rendered_fetch(self.key_for(request), request, response)
        return Fetch(
            key=self.key_for(request),
            url=meta.get("catalog_url", request.url),
            final_url=response.url,
            method=request.method,
            request_headers=_headers(request.headers, _HIDDEN_REQUEST_HEADERS),
            request_body=request.body,
            status=response.status,
            response_headers=_headers(response.headers),
            body=response.body,
        )

    def process_exception(self, request: Request, exception: Exception) -> None:
        if self.log is None or isinstance(exception, CachedRequest) or _is_robots(request):
            return None
        if isinstance(exception, IgnoreRequest):
            error = str(exception) or "ignored"
        else:
            error = f"{type(exception).__name__}: {exception}"
        self._record(request, "error", error=error)
        return None
