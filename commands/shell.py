"""``scrapy shell URL`` answering from the archive.

ARCHIVE_SHELL (``-s ARCHIVE_SHELL=...``):

- ``archive`` (default): a URL in the catalog is answered from the archive (no
  network); any other is fetched live and stored, like a crawl would (when another
  crawl holds the data directory, it is fetched but not stored);
- ``offline``: only stored responses; anything else is ignored, nothing is sent;
- ``live``: everything is fetched from the network; nothing is stored.
"""

from __future__ import annotations

import logging
import sqlite3
import sys

from scrapy.commands.shell import Command as ScrapyShellCommand
from scrapy.exceptions import UsageError

from crawler.cli import CheckedSettings, tidy_parser
from crawler.quietlog import quiet_crawl_log
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.errors import ArchiveError, CatalogError
from crawler.storage.keys import request_key

logger = logging.getLogger(__name__)

STORAGE = "extensions.archive_cache.ArchiveCacheStorage"
HTTPCACHE_MW = "scrapy.downloadermiddlewares.httpcache.HttpCacheMiddleware"
MODES = ("archive", "offline", "live")


def shell_settings(settings, data_dir_free: bool = True) -> dict:
    """The settings that make the shell answer as ARCHIVE_SHELL asks."""
    mode = (settings.get("ARCHIVE_SHELL") or "archive").lower()
    if mode not in MODES:
        raise UsageError(f"ARCHIVE_SHELL must be one of {', '.join(MODES)}, not {mode!r}")
    extensions = dict(settings.getdict("EXTENSIONS"))
    # Signal handlers can only be set in the main thread; the shell runs its crawler
    # in another. Progress lines would interleave with the console.
    extensions["extensions.stop_signals.StopSignalsExtension"] = None
    # No crawl process to watch: the shell writes no heartbeat to the hub.
    common = {"EXTENSIONS": extensions, "PROGRESS_INTERVAL": 0, "HEARTBEAT_ENABLED": False}
    if mode == "live":
        return {**common, "HTTPCACHE_ENABLED": False, "ARCHIVE_ENABLED": False}
    middlewares = dict(settings.getdict("DOWNLOADER_MIDDLEWARES"))
    # Before ArchiveMiddleware (75), which would drop a stored URL instead of answering.
    middlewares[HTTPCACHE_MW] = 50
    return {
        **common,
        "HTTPCACHE_ENABLED": True,
        "HTTPCACHE_STORAGE": STORAGE,
        "HTTPCACHE_POLICY": "scrapy.extensions.httpcache.DummyPolicy",
        "HTTPCACHE_EXPIRATION_SECS": 0,
        "HTTPCACHE_IGNORE_MISSING": mode == "offline",
        "DOWNLOADER_MIDDLEWARES": middlewares,
        "ARCHIVE_ENABLED": mode == "archive" and data_dir_free,
        # It stores what it fetches, but is no run: the report's latest run stays a crawl.
        "ARCHIVE_RUNS_LOG": False,
    }


class Command(CheckedSettings, ScrapyShellCommand):
    def short_desc(self) -> str:
        return "Console; stored URLs answered from the archive (ARCHIVE_SHELL)"

    def long_desc(self) -> str:
        modes = __doc__.split("\n\n", 1)[1].replace("``", "`")
        return super().long_desc() + "\n\n" + modes

    def add_options(self, parser) -> None:
        super().add_options(parser)
        tidy_parser(parser)

    def process_options(self, args, opts) -> None:
        super().process_options(args, opts)
        quiet_crawl_log(self.settings.getbool("LOG_QUIET"))
        datadir = DataDir.from_settings(self.settings)
        self.problem = data_dir_problem(datadir, self.settings)
        # Offline reads only: no lock to try (a read-only data directory will do).
        free = True if self.problem or offline(self.settings) else datadir.is_free()
        self.free = free
        if not free and not args and mode(self.settings) == "archive":
            logger.warning(
                "%s is in use by a crawl: URLs fetched live are not stored", datadir.root
            )
        for name, value in shell_settings(self.settings, free).items():
            if (self.settings.getpriority(name) or 0) < 40:
                self.settings.set(name, value, priority="project")

    def update_vars(self, vars: dict) -> None:  # noqa: A002 - Scrapy's name
        # Scrapy's hook for the shell's variables, called with the crawler once the
        # shell has one: the crawler whose storage is closed when the shell ends.
        super().update_vars(vars)
        self.shell_crawler = vars.get("crawler")

    def run(self, args, opts) -> None:
        self.shell_crawler = None
        if problem := getattr(self, "problem", None):
            print(f"error: {problem}", file=sys.stderr)
            self.exitcode = 2  # nothing started: a usage problem (docs: exit statuses)
            return
        if args and (problem := offline_miss(self.settings, args[0])):
            print(f"error: {problem}", file=sys.stderr)
            self.exitcode = 1
            return
        if args and (said := where_from(self.settings, args[0], self.free)):
            print(said, file=sys.stderr)
        try:
            super().run(args, opts)
        finally:
            if self.shell_crawler is not None:
                close_storage(self.shell_crawler)


def offline(settings) -> bool:
    return mode(settings) == "offline"


def data_dir_problem(datadir: DataDir, settings) -> str | None:
    """Why the shell cannot use ``datadir`` as ARCHIVE_SHELL asks (None: it can).

    Offline it only reads, and needs the catalog; ``archive`` also stores, and creates
    the data directory and its catalog when they are not there yet."""
    mode = (settings.get("ARCHIVE_SHELL") or "archive").lower()
    if mode == "offline":
        return datadir.unusable()
    if mode == "archive" and datadir.root.exists():
        return datadir.unusable(write=True, need_catalog=False)
    return None


def stored_row(settings, url: str):
    """The catalog row of *url* in DATA_DIR, or None; raises ShellError when the
    catalog cannot be read."""
    datadir = DataDir.from_settings(settings)
    if not datadir.catalog_path.exists():
        return None
    try:
        with Catalog(datadir.catalog_path, readonly=True) as catalog:
            return catalog.get(request_key(url))
    except (CatalogError, sqlite3.DatabaseError) as exc:
        raise ShellError(
            f"cannot read the catalog {datadir.catalog_path} ({exc}): check it with "
            "`scrapy catalog verify`, or rebuild it with `scrapy catalog rebuild`"
        ) from exc


class ShellError(Exception):
    """The shell cannot answer as ARCHIVE_SHELL asks (the message says why)."""


def offline_miss(settings, url: str) -> str | None:
    """Why ``url`` cannot be answered offline, or None when it can (or is not offline).

    Offline, Scrapy's shell would hand the console ``response = None`` for a URL that
    is not stored, or whose stored copy cannot be read, and the user's first
    ``response.status`` would fail.
    """
    if mode(settings) != "offline" or not absolute(url):
        return None
    datadir = DataDir.from_settings(settings)
    try:
        row = stored_row(settings, url)
    except ShellError as exc:
        return str(exc)
    if row is not None:
        return unreadable_copy(datadir, row)
    return (
        f"{url} is not in the catalog of {datadir.root} (ARCHIVE_SHELL=offline fetches "
        "nothing): fetch and store it with `scrapy shell URL`, or crawl it with "
        "`scrapy crawl site -a urls=FILE`"
    )


def where_from(settings, url: str, data_dir_free: bool = True) -> str | None:
    """One line saying where the shell's response to *url* comes from: the archive, or
    the network (stored or not), and the setting that changes it."""
    if not absolute(url):
        return None  # a local file, or a URL Scrapy completes: not ours to judge
    root = DataDir.from_settings(settings).root
    if mode(settings) == "live":
        return f"{url}: fetched from the network, not stored (ARCHIVE_SHELL=live)"
    try:
        if stored_row(settings, url) is not None:
            return f"{url}: stored in {root}, answered from the archive (nothing is sent)"
    except ShellError:
        pass  # Scrapy's shell reports it, as a crawl would
    if mode(settings) == "offline":
        return None  # offline_miss said it already
    if not data_dir_free:
        return (
            f"{url}: not stored; fetched from the network and NOT stored, {root} is in "
            "use by a crawl (-s ARCHIVE_SHELL=offline never fetches)"
        )
    return (
        f"{url}: not stored; fetched from the network and stored in {root}, as a crawl "
        "would (-s ARCHIVE_SHELL=offline never fetches)"
    )


def absolute(url: str) -> bool:
    return url.lower().startswith(("http://", "https://"))


def mode(settings) -> str:
    return (settings.get("ARCHIVE_SHELL") or "archive").lower()


def unreadable_copy(datadir: DataDir, row) -> str | None:
    """Why the stored copy of ``row`` cannot be read, or None when it can."""
    try:
        datadir.read(row)
    except (ArchiveError, OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return (
            f"the stored copy of {row.url} cannot be read ({row.archive}, offset "
            f"{row.offset}: {why}): restore that file, or drop the rows it lost with "
            "`scrapy catalog verify --fix` and fetch the URL again"
        )
    return None


def close_storage(crawler) -> None:
    """Commit what the shell stored and stop the archive writer process: the shell
    leaves without closing its spider, and the writer would outlive it."""
    from twisted.internet import reactor
    from twisted.internet.threads import blockingCallFromThread

    from extensions.storage import StorageExtension

    storage = StorageExtension.of(crawler)
    if storage is not None:
        # On the crawler's thread: the catalog connection belongs to it.
        blockingCallFromThread(reactor, storage.close)
