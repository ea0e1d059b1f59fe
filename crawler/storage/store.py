"""The store: archive + catalog written in the order that makes them crash-safe.

:class:`Store` does the work in-process; the writer process
(:mod:`crawler.storage.writer`) runs one, so that gzip, fsync and SQLite commits never
run on the crawl's reactor thread and use another core.

The ordering: a catalog row is committed only after the record it points at is
flushed and fsynced (the batch writer's ``before_commit`` hook), and an archive file
loses its ``.writing`` marker only after the rows pointing into it are committed.
:func:`recover` repairs what a killed run left unfinished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from crawler.storage import actionlog, formats
from crawler.storage.actionlog import ActionLog, Outcome
from crawler.storage.batch import BatchWriter
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.errors import StoreError
from crawler.storage.formats.base import Repair
from crawler.storage.items import ItemStore, PageItems, PageLogWriter, RecoveredPagesWriter
from crawler.storage.records import Fetch, Row, Touch, header, payload_digest, warc_date


@dataclass
class StoreConfig:
    data_dir: Path
    prefix: str = "crawl"
    rollover_bytes: int = 1_000_000_000
    gzip_level: int = 1
    compressor: str = "isal"
    batch_size: int = 200
    flush_seconds: float = 5.0
    rollover_seconds: float = 0.0
    format: str = formats.DEFAULT  # a name in crawler.storage.formats.FORMATS
    format_options: dict = field(default_factory=dict)  # ArchiveFormat.options()
    # Hold each row until its page's items arrive, and commit them together.
    items: bool = False
    # ARCHIVE_DEDUP: "digest" also stores a payload that another key's record holds
    # as a revisit of it ("url" and "off" are the crawl's to decide).
    dedup: str = "url"

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)

    @property
    def datadir(self) -> DataDir:
        return DataDir(self.data_dir)


@dataclass
class Recovery:
    repairs: list[Repair] = field(default_factory=list)
    indexed_rows: int = 0
    log_cut: bytes = b""  # a torn last line cut off the action log


def recover(datadir: DataDir, log_pages: bool = False, items: bool = False) -> Recovery:
    """Repair archives a killed run left unfinished, index what the catalog lacks, and
    cut a torn last line off the action log. ``log_pages``: the rows indexed go to the
    page log too, with them (a crawl without items). ``items``: they go to the list of
    recovered pages instead, whose items are still to parse (and which are logged with
    their items).

    Call it with the data directory locked and no writer running.
    """
    result = Recovery(log_cut=actionlog.repair(datadir.action_log_path))
    for marker in datadir.stale_markers():
        marker.unlink()
    open_files = datadir.open_archives()
    if not open_files:
        return result
    with Catalog(datadir.catalog_path) as catalog:
        for path in open_files:
            repair = formats.for_path(path).repair(path, datadir.root)
            result.repairs.append(repair)
            indexed = repair.indexed
            result.indexed_rows += index_missing(
                catalog, indexed.rows, indexed.touches, log_pages, items, indexed.downloads
            )
    return result


def index_missing(
    catalog: Catalog,
    rows: list[Row],
    touches: list[Touch],
    log_pages: bool = False,
    items: bool = False,
    downloads: set[str] = frozenset(),
) -> int:
    """UPSERT rows the catalog lacks or holds an older fetch of; apply newer 304s.
    ``log_pages`` (``items``): append the keys of the pages among the rows to the page
    log (the recovered pages) in the same transactions; the rows of ``downloads`` (keys
    no spider callback parses) are no page of either."""
    added = 0
    with catalog.writer(batch_size=1000) as batch:
        page_log = (
            PageLogWriter(catalog.conn)
            if log_pages
            else RecoveredPagesWriter(catalog.conn)
            if items
            else None
        )
        if page_log is not None:
            batch.add_writes(page_log)
        for row in rows:
            have = catalog.get(row.key)
            if have is None or have.fetched_at < row.fetched_at:
                batch.upsert(row)
                if page_log is not None and row.key not in downloads:
                    page_log.add(row.key)
                added += 1
        for key, etag, last_modified, fetched_at in touches:
            have = catalog.get(key)
            if have is not None and have.fetched_at < fetched_at:
                batch.touch(key, etag, last_modified, fetched_at)
    return added


class Store:
    """Writes fetches to the archive and their rows to the catalog, in that order."""

    def __init__(self, config: StoreConfig):
        self.config = config
        self.datadir = datadir = config.datadir
        self.catalog = Catalog(datadir.catalog_path)
        self.archive = formats.get(config.format).writer(
            datadir.archive_dir,
            datadir.root,
            prefix=config.prefix,
            rollover_bytes=config.rollover_bytes,
            rollover_seconds=config.rollover_seconds,
            gzip_level=config.gzip_level,
            compressor=config.compressor,
            **config.format_options,
        )
        self.batch = BatchWriter(
            self.catalog,
            batch_size=config.batch_size,
            flush_seconds=config.flush_seconds,
            before_commit=self.archive.flush,
            after_commit=self._log_committed,
        )
        self.items: ItemStore | None = None
        self.page_log: PageLogWriter | None = None
        if config.items:
            self.items = ItemStore(self._queue_row, self.catalog.conn)
            self.batch.add_writes(self.items)
        else:
            self.page_log = PageLogWriter(self.catalog.conn)
            self.batch.add_writes(self.page_log)
        self._roll_due: float | None = None
        # With ARCHIVE_DEDUP=digest: the rows written since the last commit by digest,
        # which the catalog cannot answer for yet.
        self._recent: dict[str, Row] | None = None
        if config.dedup == "digest":
            self.catalog.index_digests()
            self._recent = {}
        # While put_many stores a batch: the rows it wrote, and the catalog's answers
        # for the digests it asked for (found or not).
        self._batch: dict[str, Row] = {}
        self._found: dict[str, Row] = {}
        self._asked: set[str] = set()
        self.stored = 0
        self.revisits = 0  # fetches stored as revisits, of their key's row or by digest
        self.unchanged = 0  # of those, the ones of their key's stored row
        self.unchanged_bytes = 0
        self.refreshed = 0
        self.bytes = 0
        self._log: ActionLog | None = None
        self._actions: list[dict] = []  # action lines of rows not yet committed
        self._held_actions: dict[str, dict] = {}  # those of rows held for their items

    def put(self, fetch: Fetch, action: dict | None = None, stored: Row | None = None) -> Row:
        """Store a fetch; ``action``: its action-log line (ActionLog.write's arguments),
        written here once its row is committed (a killed run then never logs ``ok``
        for a page it fetches again), and to spare the crawl's thread the work.
        ``stored``: the key's stored row, whose record may hold the fetch's payload
        already (the crawl checked what its attributes say): when the digests are
        equal, the fetch is stored as a revisit of it and its line says ``unchanged``
        (counted in ``unchanged``, ``unchanged_bytes``). The digest is computed here,
        once, off the crawl's thread."""
        digest = None
        if stored is not None or self._recent is not None:
            digest = payload_digest(fetch.body)
        return self._put(fetch, action, stored, digest)

    @property
    def looks_up_digests(self) -> bool:
        """Whether each fetch's payload is looked up by digest (ARCHIVE_DEDUP=digest):
        :meth:`put_many` then asks the catalog once for several fetches."""
        return self._recent is not None

    def put_many(self, puts: list[tuple]) -> None:
        """:meth:`put` of each of ``puts`` (``(fetch, action, stored)``), in order; with
        ARCHIVE_DEDUP=digest, the catalog is asked for all their payloads in one
        query (an answer may then be a row that a fetch of the same batch replaced:
        its record still holds that payload, and the revisit refers to it)."""
        if self._recent is None or len(puts) < 2:
            for args in puts:
                self.put(*args)
            return
        digests = [payload_digest(args[0].body) for args in puts]
        asked = [
            digest
            for (fetch, _, stored), digest in zip(puts, digests, strict=True)
            if self._looked_up(fetch, stored, digest)
        ]
        self._found = self.catalog.by_digests(asked)
        self._asked = set(asked)
        try:
            for (fetch, action, stored), digest in zip(puts, digests, strict=True):
                self._put(fetch, action, stored, digest)
        finally:
            self._found, self._asked, self._batch = {}, set(), {}

    def _looked_up(self, fetch: Fetch, stored: Row | None, digest: str) -> bool:
        """Whether ``fetch`` is looked up by digest (not its key's payload, not empty,
        not rendered) under ARCHIVE_DEDUP=digest."""
        if stored is not None and digest == stored.payload_digest:
            return False
        return bool(fetch.body) and fetch.rendered_body is None

    def _put(
        self, fetch: Fetch, action: dict | None, stored: Row | None, digest: str | None
    ) -> Row:
        original = None
        if stored is not None and digest == stored.payload_digest:
            original = stored
            self.unchanged += 1
            self.unchanged_bytes += len(fetch.body)
            if action is not None:
                action["outcome"] = Outcome.UNCHANGED
        elif self._recent is not None:
            original = self._same_payload(fetch, digest)
        if original is not None:
            row = self.archive.write_unchanged(fetch, original)
            self.revisits += 1
        else:
            row = self.archive.write_fetch(fetch, digest)
            self.stored += 1
            self.bytes += row.bytes
            if self._recent is not None and not row.rendered:
                self._recent[row.payload_digest] = row
                if self._asked:
                    self._batch[row.payload_digest] = row
        if self.items is not None and fetch.parsed:
            if action is not None:
                self._held_actions[row.key] = action
            self.items.hold(row)
        elif self.items is not None:
            if action is not None:
                self._actions.append(action)
            self.items.unparsed(row)
        else:
            if action is not None:
                self._actions.append(action)
            if fetch.parsed:  # a page a follower parses (crawler/reparse/follow.py)
                self.page_log.add(row.key)
            self.batch.upsert(row)
        self._maybe_roll()
        return row

    def _same_payload(self, fetch: Fetch, digest: str) -> Row | None:
        """A row whose record holds ``fetch``'s payload (ARCHIVE_DEDUP=digest): of
        those written since the last commit, or of this batch (a commit in its middle
        empties the former), or the catalog's (asked for the batch at its start)."""
        if not fetch.body or fetch.rendered_body is not None:
            return None
        found = self._recent.get(digest) or self._batch.get(digest)
        if found is not None:
            return found
        if digest in self._asked:
            return self._found.get(digest)
        return self.catalog.by_digest(digest)

    def progress(self) -> tuple[int, int, int]:
        """Rows committed, and the fetches found unchanged (kept as revisits of their
        ``stored`` row) with their bytes: what the crawl's counters follow."""
        return self.batch.committed, self.unchanged, self.unchanged_bytes

    def page_items(self, page: PageItems) -> None:
        """A page's items: committed with its row (held since ``put``)."""
        if self.items is None:
            raise StoreError("this store was opened without items (StoreConfig.items)")
        self.items.done(page)
        if self.batch.due():
            self.batch.flush()
        self._maybe_roll()

    def touch(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        """A 304: refresh validators and time; no new body."""
        self.archive.write_revisit(fetch, refers_to_date)
        self.batch.touch(
            fetch.key,
            header(fetch.response_headers, "ETag"),
            header(fetch.response_headers, "Last-Modified"),
            warc_date(fetch.fetched_at),
        )
        self.refreshed += 1
        self._maybe_roll()

    def _queue_row(self, row: Row) -> None:
        """Queue a row held for its items, with its ``ok`` line (written after the
        commit of both)."""
        action = self._held_actions.pop(row.key, None)
        if action is not None:
            self._actions.append(action)
        self.batch.upsert(row)

    def _log_committed(self) -> None:
        if self._recent:
            self._recent.clear()  # the catalog answers for them now
        actions, self._actions = self._actions, []
        if not actions:
            return
        path = self.datadir.action_log_path
        try:
            if self._log is None:
                self._log = ActionLog(path)
            for action in actions:
                self._log.write(**action)
        except OSError as exc:  # os.write names no file: say which one
            raise OSError(exc.errno, exc.strerror, str(path)) from exc

    def _maybe_roll(self) -> None:
        # A file is closed once no held row points into it, so that a kill leaves it
        # open and the next run indexes its records (crawler/storage/items.py); but
        # not later than CATALOG_FLUSH_SECONDS past its time (at worst, a kill then
        # costs a page fetched again).
        if not self.archive.needs_rollover():
            self._roll_due = None
            return
        if self.items and self.items.held:
            now = time.monotonic()
            self._roll_due = self._roll_due or now
            if now - self._roll_due < self.config.flush_seconds:
                return
        self._roll_due = None
        self.batch.flush()
        self.archive.close()

    def tick(self) -> None:
        """Commit a batch whose time is up, and roll over a file whose time is up
        (call it whenever idle: it costs nothing when there is nothing to do)."""
        if self.batch.due() or not self.batch.pending:
            # With nothing pending this only restarts the clock: the first row after
            # a pause waits at most CATALOG_FLUSH_SECONDS for its commit.
            self.batch.flush()
        self._maybe_roll()

    def abandon(self) -> None:
        """Drop everything as a kill leaves it, for crash tests: the records written so
        far reach the file, which keeps its ``.writing`` marker; pending rows are never
        committed."""
        self.archive.abandon()
        self.catalog.close()
        if self._log is not None:
            self._log.close()

    def close(self, complete: bool = True) -> dict:
        """Commit and close. ``complete=False`` (the crawl died): rows still waiting
        for their items are dropped, so that their pages are fetched again."""
        if self.items is not None and self.items.held:
            if not complete:
                # Their records stay in a file left open, indexed by the next run.
                self.batch.flush()
                self.abandon()
                return {}
            self.items.release_held()
        self.batch.flush()
        self.archive.close()
        self.catalog.close()
        if self._log is not None:
            self._log.close()
        return {
            "stored": self.stored,
            "revisits": self.revisits,
            "unchanged": self.unchanged,
            "unchanged_bytes": self.unchanged_bytes,
            "refreshed": self.refreshed,
            "bytes": self.bytes,
            "rows_committed": self.batch.committed,
            "items": self.items.items if self.items is not None else 0,
            "archives": [str(p) for p in self.archive.closed_files],
        }
