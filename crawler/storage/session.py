"""One crawl's storage, opened and closed as a whole: :class:`StorageSession`.

What a crawl does with its data directory, in order: lock it, repair what a killed
run left open, create or migrate the catalog, index the other catalogs it must not
fetch again (``CATALOG_SEEN``), open the action log and have the writer process open
the store; then look keys up, replay stored records, hand fetches to the writer; at
the end, drain the writer, release everything and say what the run stored.

``extensions/storage/`` is the Scrapy adapter over it; ``scrapy shell`` and the
offline HTTP cache (``extensions/archive_cache.py``) replay through it. No Scrapy here.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from crawler import settingspecs
from crawler.storage import formats
from crawler.storage.actionlog import ActionLog
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.errors import ArchiveError, CatalogError, SettingError, StoreError
from crawler.storage.records import Row, StoredRecord
from crawler.storage.runlog import append_run, end_run, peak_rss
from crawler.storage.seen import CatalogWithSeen, with_seen
from crawler.storage.store import Recovery, StoreConfig, recover
from crawler.storage.writer.client import ReplyWatcher, WriterProcess

logger = logging.getLogger(__name__)


@dataclass
class SessionConfig:
    """The storage settings of a crawl, checked together."""

    store: StoreConfig
    store_statuses: frozenset[int] = frozenset({200})
    queue_bytes: int = 1 << 20
    seen: list[str] = field(default_factory=list)  # CATALOG_SEEN

    @property
    def datadir(self) -> DataDir:
        return self.store.datadir

    @classmethod
    def from_settings(cls, settings) -> SessionConfig:
        """From Scrapy settings, each read as crawler/settingspecs.py declares it; a bad
        value raises SettingError naming the setting."""

        def get(name: str):
            try:
                return settingspecs.check_value(name, settings.get(name))
            except settingspecs.SettingValueError as exc:
                raise SettingError(str(exc)) from None

        try:
            settingspecs.check_combinations(get)
        except settingspecs.SettingValueError as exc:
            raise SettingError(str(exc)) from None
        fmt = formats.get(get("ARCHIVE_FORMAT"))
        return cls(
            store=StoreConfig(
                data_dir=DataDir.from_settings(settings).root,
                prefix=get("ARCHIVE_PREFIX") or "crawl",
                rollover_bytes=get("ARCHIVE_ROLLOVER_BYTES"),
                gzip_level=get("ARCHIVE_GZIP_LEVEL"),
                compressor=get("ARCHIVE_COMPRESSOR"),
                batch_size=get("CATALOG_BATCH_SIZE"),
                flush_seconds=get("CATALOG_FLUSH_SECONDS"),
                rollover_seconds=get("ARCHIVE_ROLLOVER_SECONDS"),
                format=fmt.name,
                format_options=fmt.options(settings),
                items=get("CATALOG_ITEMS_ENABLED"),
                dedup=get("ARCHIVE_DEDUP"),
            ),
            store_statuses=frozenset(get("CATALOG_STORE_STATUSES")),
            queue_bytes=get("ARCHIVE_QUEUE_BYTES"),
            seen=get("CATALOG_SEEN"),
        )


@dataclass
class EndSummary:
    """What a run stored and what the data directory holds, said at its end."""

    stored: int
    stored_bytes: int
    refreshed: int
    datadir: DataDir
    rows: int
    by_status: dict[int, int]
    body_bytes: int
    archive_bytes: int
    archive_files: int
    revisits: int = 0  # fetches stored as revisits: unchanged, or by digest
    unchanged: int = 0  # of those, pages fetched again with their stored payload
    peak: dict[str, float] = field(default_factory=dict)  # runlog.peak_rss()

    def text(self) -> str:
        """What the run stored, counted as its outcome line counts it: a page new to its
        URL is stored (``ok``), whole or as a revisit of the same payload under another
        URL (ARCHIVE_DEDUP=digest); a page fetched again unchanged is not."""
        by_status = ", ".join(f"{s}: {n}" for s, n in self.by_status.items()) or "none"
        by_digest = self.revisits - self.unchanged
        return (
            f"This run stored {self.stored + by_digest} responses ({self.stored_bytes:,} bytes"
            + (
                f"; {by_digest} of them as revisits of the same payload under another URL)"
                if by_digest
                else ")"
            )
            + (f", {self.unchanged} unchanged as revisits," if self.unchanged else "")
            + f" and refreshed {self.refreshed}.\n"
            f"Catalog {self.datadir.catalog_path}: {self.rows} rows ({by_status}), "
            f"{self.body_bytes:,} bytes of bodies.\n"
            f"Archive {self.datadir.archive_dir}: {self.archive_bytes / 1e6:.1f} MB in "
            f"{self.archive_files} files. Action log: {self.datadir.action_log_path}"
            + (
                f"\nPeak RSS: {self.peak['peak_rss_mib']:,.1f} MiB (crawl process), "
                f"{self.peak['children_peak_rss_mib']:,.1f} MiB (its largest child process, "
                "the archive writer)"
                if self.peak
                else ""
            )
        )


class StorageSession:
    """A crawl's data directory, from :meth:`open` to :meth:`close`.

    After :meth:`open`, ``lookup``, ``present``, ``put`` and ``touch`` are the methods
    of the catalog and of the writer process themselves: the crawl calls them for
    every request and response, and the session adds no call of its own.
    """

    def __init__(self, config: SessionConfig):
        self.config = config
        self.datadir = config.datadir
        self.writer: WriterProcess | None = None
        self.catalog: Catalog | CatalogWithSeen | None = None
        self.log: ActionLog | None = None
        self.recovery: Recovery | None = None  # what open() repaired
        # Rows the writer reported committed, once closed (its summary, when it failed).
        self.rows_committed = 0
        self._unchanged = (0, 0)  # unchanged(), once closed
        self._run: dict | None = None  # this run's line of runs.jsonl
        # Peak memory of the crawl's process and its writer's, once closed (peak_rss()).
        self.peak: dict[str, float] = {}
        self._lock = self.datadir.lock()

    @classmethod
    def reading(cls, datadir: DataDir) -> StorageSession:
        """A session that only looks up and replays (open it with :meth:`open_readonly`)."""
        return cls(SessionConfig(StoreConfig(datadir.root)))

    # -- before open: nothing is stored ----------------------------------------------

    def lookup(self, key: str) -> Row | None:
        """The row of ``key`` (this catalog, then the seen ones), or None."""
        return None

    def present(self, keys: list[str]) -> set[str]:
        """The stored ones among ``keys``, in one query."""
        return set()

    def put(self, fetch, action: dict | None = None, stored: Row | None = None) -> None:
        """Store a fetch; ``action`` is its action-log line, written once it is stored;
        ``stored``: the key's stored row, which the fetch is kept as a revisit of (its
        line saying ``unchanged``) if the writer finds the same payload digest."""
        raise StoreError("the storage session is not open")

    def touch(self, fetch, refers_to_date: str | None = None) -> None:
        """Store a 304: validators and time refreshed, the body kept."""
        raise StoreError("the storage session is not open")

    def page_items(self, page) -> None:
        """A page's items (PageItems), committed with the page's row."""
        raise StoreError("the storage session is not open")

    # -- life cycle ------------------------------------------------------------------

    def start_writer(self, on_commit: Callable[[], None] | None = None) -> None:
        """Start the writer process now, so that it loads while the crawl starts up.
        ``on_commit`` is called after each commit the writer reports, while its
        replies are read (:meth:`check`, or a reactor watching :meth:`writer_watcher`)."""
        if self.writer is None:
            self.writer = WriterProcess(queue_bytes=self.config.queue_bytes, on_commit=on_commit)

    def writer_watcher(self, on_readable: Callable[[], None]) -> ReplyWatcher | None:
        """What an event loop watches to call ``on_readable`` (which calls
        :meth:`check`) as soon as the writer replies; None with no writer open."""
        if self.writer is None or self.writer.reply_fd is None:
            return None
        return ReplyWatcher(self.writer.reply_fd, on_readable)

    def open(
        self,
        spider: str = "",
        settings: dict[str, str] | None = None,
        arguments: dict[str, str] | None = None,
    ) -> Recovery:
        """Open everything a crawl writes with; raises StoreError, CatalogError or
        OSError (what is open by then is released by :meth:`close`). With *settings*
        (plain text, credentials already redacted), the run is appended to
        ``runs.jsonl`` once the data directory is locked, with the spider's
        *arguments*."""
        self.start_writer()
        self._lock.acquire()
        items = self.config.store.items
        recovery = recover(self.datadir, log_pages=not items, items=items)
        for repair in recovery.repairs:
            logger.warning(
                "Repaired %s left open by a killed run: %d records kept, %d bytes cut%s",
                repair.path,
                repair.records,
                repair.cut_bytes,
                f" (saved in {repair.cut_file})" if repair.cut_file else "",
            )
        if recovery.indexed_rows:
            logger.warning("Indexed %d stored records the catalog lacked", recovery.indexed_rows)
        if recovery.log_cut:
            logger.warning(
                "Cut a torn last line (%d bytes) off %s, left by a killed run or a full disk",
                len(recovery.log_cut),
                self.datadir.action_log_path,
            )
        with Catalog(self.datadir.catalog_path) as catalog:  # creates or migrates it
            if self.config.store.dedup == "digest":
                # Here rather than in the writer process, whose start has a time limit:
                # the first crawl with ARCHIVE_DEDUP=digest indexes the whole catalog.
                catalog.index_digests()
        self._open_catalog(with_seen(self._readonly_catalog(), self.config.seen))
        self.log = ActionLog(self.datadir.action_log_path)
        if settings is not None:
            self._run = append_run(self.datadir.runs_path, spider, settings, arguments)
        self.writer.open(self.config.store)
        # A full scan of the catalog: off the crawl's way, it only warns.
        threading.Thread(
            target=self.warn_missing_archives, name="archive-check", daemon=True
        ).start()
        self.put = self.writer.put
        self.touch = self.writer.touch
        self.page_items = self.writer.page_items
        self.recovery = recovery
        return recovery

    def warn_missing_archives(self) -> list[str]:
        """Warn of archive files the catalog's rows name that are gone: their pages count
        as stored (never fetched again) but cannot be read. Returns them."""
        try:
            with Catalog(self.datadir.catalog_path, readonly=True) as catalog:
                missing = self.datadir.missing_archives(catalog.archive_names())
        except (CatalogError, sqlite3.Error) as exc:
            logger.debug("Could not look for missing archive files: %s", exc)
            return []
        if missing:
            shown = ", ".join(missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            logger.warning(
                "%d archive files named by the catalog of %s are missing: %s; their pages "
                "count as stored but cannot be read (run `scrapy catalog verify --fix` to "
                "drop their rows, so that they are fetched again)",
                len(missing),
                self.datadir.root,
                shown,
            )
        return missing

    def unchanged(self) -> tuple[int, int]:
        """How many fetches put with their key's stored row the writer kept as
        revisits of it, and their bytes, as it last reported (after a commit, and in
        its summary)."""
        return self.writer.unchanged if self.writer is not None else self._unchanged

    def check(self) -> None:
        """Raise StoreError if the writer process failed or died (a crawl calls this
        while idle too: a failure must not wait for the next response to be seen)."""
        if self.writer is not None and self.writer.opened:
            self.writer.check()

    def open_readonly(self) -> None:
        """Open the catalog for lookups and replay only (no lock, no writer); raises
        CatalogError when there is no usable catalog."""
        self._open_catalog(self._readonly_catalog())

    def _readonly_catalog(self) -> Catalog:
        return Catalog(self.datadir.catalog_path, readonly=True)

    def _open_catalog(self, catalog: Catalog | CatalogWithSeen) -> None:
        self.catalog = catalog
        self.lookup = catalog.get
        self.present = catalog.present

    def replay(self, row: Row) -> StoredRecord | None:
        """The stored answer ``row`` points at; None (logged) when it cannot be read,
        which callers treat as not stored."""
        try:
            return self.datadir.read(row)
        except (ArchiveError, OSError, ValueError) as exc:
            logger.warning("Stored copy of %s unreadable, treated as not stored: %s", row.url, exc)
            return None

    def close(self) -> dict | None:
        """Drain and stop the writer, close the catalogs and the log, release the lock.

        Returns the writer's summary (None when it never opened the store); raises
        StoreError when the writer failed, with everything else released.
        """
        writer, self.writer = self.writer, None
        for name in ("put", "touch", "page_items", "lookup", "present"):
            self.__dict__.pop(name, None)
        try:
            return writer.close() if writer is not None else None
        finally:
            if writer is not None:
                self.rows_committed = writer.rows_committed
                self._unchanged = writer.unchanged
            if self.catalog is not None:
                self.catalog.close()
                self.catalog = None
            if self.log is not None:
                self.log.close()
                self.log = None
            self._end_run()
            self._lock.release()

    def _end_run(self) -> None:
        """Note the run's peak memory, on its line of runs.jsonl too (the writer
        process has exited: its peak counts among the children's)."""
        self.peak = peak_rss()
        run, self._run = self._run, None
        if run is None:
            return
        try:
            end_run(self.datadir.runs_path, run, self.peak)
        except OSError as exc:
            logger.warning("Could not record the run's end in %s: %s", self.datadir.runs_path, exc)

    def summary(self, stored: dict) -> EndSummary:
        """The end-of-crawl summary, from the writer's summary and the catalog's totals."""
        with Catalog(self.datadir.catalog_path, readonly=True) as catalog:
            totals = catalog.summary()
        archive_bytes, files = self.datadir.archive_bytes()
        return EndSummary(
            stored=stored["stored"],
            stored_bytes=stored["bytes"],
            refreshed=stored["refreshed"],
            revisits=stored.get("revisits", 0),
            unchanged=stored.get("unchanged", 0),
            datadir=self.datadir,
            rows=totals["rows"],
            by_status=totals["by_status"],
            body_bytes=totals["bytes"],
            archive_bytes=archive_bytes,
            archive_files=files,
            peak=self.peak,
        )
