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
from pathlib import Path

from scrapy.commands.shell import Command as ScrapyShellCommand
from scrapy.exceptions import UsageError

from crawler.store import DataDirLock, StoreError

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
    common = {"EXTENSIONS": extensions, "PROGRESS_INTERVAL": 0}
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
    }


def data_dir_free(data_dir: Path) -> bool:
    """Whether no crawl holds the data directory right now."""
    lock = DataDirLock(data_dir / ".lock")
    try:
        lock.acquire()
    except StoreError:
        return False
    lock.release()
    return True


class Command(ScrapyShellCommand):
    def short_desc(self) -> str:
        return "Interactive console; stored URLs are answered from the archive (ARCHIVE_SHELL)"

    def long_desc(self) -> str:
        return super().long_desc() + " " + __doc__.split("\n\n", 1)[1].replace("\n", " ")

    def process_options(self, args, opts) -> None:
        super().process_options(args, opts)
        data_dir = Path(self.settings.get("DATA_DIR") or "data")
        free = data_dir_free(data_dir)
        if not free and (self.settings.get("ARCHIVE_SHELL") or "archive") == "archive":
            logger.warning("%s is in use by a crawl: URLs fetched live are not stored", data_dir)
        for name, value in shell_settings(self.settings, free).items():
            if (self.settings.getpriority(name) or 0) < 40:
                self.settings.set(name, value, priority="project")

    def run(self, args, opts) -> None:
        created = []
        create = self.crawler_process._create_crawler

        def capture(spidercls):
            crawler = create(spidercls)
            created.append(crawler)
            return crawler

        self.crawler_process._create_crawler = capture
        try:
            super().run(args, opts)
        finally:
            for crawler in created:
                close_archive(crawler)


def close_archive(crawler) -> None:
    """Commit what the shell stored and stop the archive writer process (the shell
    leaves without closing its spider, and the writer would keep the process alive)."""
    from middlewares.archive import ArchiveMiddleware

    engine = getattr(crawler, "engine", None)
    downloader = getattr(engine, "downloader", None)
    if downloader is None:
        return
    from twisted.internet import reactor
    from twisted.internet.threads import blockingCallFromThread

    for mw in downloader.middleware.middlewares:
        if isinstance(mw, ArchiveMiddleware):
            # On the crawler's thread: the catalog connection belongs to it.
            blockingCallFromThread(reactor, mw.spider_closed, None, "shell_closed")
