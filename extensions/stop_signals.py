"""SIGUSR1 stops the crawl gracefully, as SIGTERM does.

Slurm sends SIGUSR1 (``--signal=B:USR1@margin``) before a job's time limit. The
handler defers to whatever SIGTERM does at that moment: Scrapy's graceful stop the
first time, its forced stop the second time.
"""

from __future__ import annotations

import logging
import signal

from scrapy import signals

logger = logging.getLogger(__name__)


class StopSignalsExtension:
    def __init__(self, crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler):
        ext = cls(crawler)
        crawler.signals.connect(ext.engine_started, signal=signals.engine_started)
        return ext

    def engine_started(self) -> None:
        signal.signal(signal.SIGUSR1, self._handle)

    def _handle(self, signum, frame) -> None:
        term = signal.getsignal(signal.SIGTERM)
        if callable(term):
            term(signum, frame)
        else:
            # Imported here: importing this module must not install a reactor (the
            # crawl installs the asyncio one; slurm/forkserver.py preloads modules).
            from twisted.internet import reactor

            reactor.callFromThread(self.crawler.stop)
