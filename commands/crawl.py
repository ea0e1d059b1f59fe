"""``scrapy crawl``, with an exit status a wrapper can act on.

Exit status: 0 when the crawl finished (its whole list was handled), 75 when it was
stopped before that (a signal, a close-spider limit: run it again to resume), 1 when it
could not start or its storage failed, 2 for bad arguments or settings (a hub that cannot
be reached at start among them: nothing is fetched).
"""

from __future__ import annotations

import logging
import sys

from scrapy.commands.crawl import Command as ScrapyCrawlCommand
from scrapy.exceptions import UsageError

from crawler.hub import HubError

logger = logging.getLogger(__name__)

EXIT_FINISHED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: try again later


def exit_status(finish_reason: str | None, storage_error: str | None = None) -> int:
    # A storage failure noticed as the crawl closed leaves its finish_reason as it was.
    if storage_error:
        return EXIT_FAILED
    if finish_reason == "finished":
        return EXIT_FINISHED
    if finish_reason in (None, "storage_error"):
        return EXIT_FAILED
    return EXIT_INTERRUPTED


class Command(ScrapyCrawlCommand):
    def short_desc(self) -> str:
        return "Run a spider of the project (exit 0 finished, 75 interrupted, 1 failed)"

    def run(self, args, opts) -> None:
        if len(args) != 1:
            raise UsageError("give exactly one spider name")
        crawler = self._create_crawler(args[0])
        self._usage_error: str | None = None
        started = self.crawler_process.crawl(crawler, **opts.spargs)
        if hasattr(started, "addErrback"):  # Deferred (CrawlerProcess)
            started.addErrback(self._on_failure)
        else:  # asyncio.Task (AsyncCrawlerProcess)
            started.add_done_callback(self._on_done)
        self.crawler_process.start()
        if self._usage_error:
            print(f"error: {self._usage_error}", file=sys.stderr)
            self.exitcode = EXIT_USAGE
        elif self.crawler_process.bootstrap_failed:
            self.exitcode = EXIT_FAILED
        else:
            stats = crawler.stats
            self.exitcode = exit_status(
                stats.get_value("finish_reason"), stats.get_value("archive/error")
            )

    def _on_failure(self, failure):
        if failure.check(UsageError, HubError):
            self._usage_error = str(failure.value)
            return None
        return failure

    def _on_done(self, task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, (UsageError, HubError)):
            self._usage_error = str(exc)
        elif exc is not None:
            logger.error("The crawl could not start", exc_info=exc)
