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

from crawler.cli import CheckedSettings, EndsWithoutTeardown, tidy_parser
from crawler.quietlog import quiet_crawl_log

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


class Command(CheckedSettings, EndsWithoutTeardown, ScrapyCrawlCommand):
    # The crawl has closed its storage (metadata.db complete on its own) when work()
    # returns: what is left of the process is the interpreter's teardown.

    def short_desc(self) -> str:
        return "Run a spider of the project; exit 0 done, 75 stopped early"

    def long_desc(self) -> str:
        return """\
Run a spider: fetch, store in DATA_DIR, skip what is stored. Run it again to
resume.

Arguments of the `site` spider (-a NAME=VALUE):
- urls=FILE: the URL list, one URL a line (- reads standard input); without it,
  -s JOB=NAME crawls the job's work queue
- depth=N: follow links N levels from the listed pages (default 0)
- summaries=1: yield page summaries at crawl time, into the page_summary table
- revalidate=1: fetch stored pages again, conditionally (304: unchanged)
- render=1: render every page in a browser (scrapy-playwright)
- shard=I/N: only the listed URLs in shard I of N (Slurm array tasks)
- partition=domain|host|url: what a shard takes whole (default CRAWL_PARTITION,
  domain: one process fetches all of a site)

Exit status:
- 0: finished, its whole list handled
- 75: stopped before that (a signal, a CLOSESPIDER limit): run it again to resume
- 1: could not start, or storage failed
- 2: bad arguments or settings, an unknown spider, a hub not reachable at start"""

    def add_options(self, parser) -> None:
        super().add_options(parser)
        tidy_parser(parser)

    def process_options(self, args, opts) -> None:
        super().process_options(args, opts)
        quiet_crawl_log(self.settings.getbool("LOG_QUIET"))

    def work(self, args, opts) -> None:
        if len(args) != 1:
            raise UsageError("give exactly one spider name", print_help=False)
        names = self.crawler_process.spider_loader.list()
        if args[0] not in names:
            raise UsageError(
                f"no spider named {args[0]!r}: the project has {', '.join(sorted(names))}",
                print_help=False,
            )
        crawler = self._create_crawler(args[0])
        # Recorded with the run in runs.jsonl (a depth crawl's depth is no setting).
        crawler.settings.set("SPIDER_ARGUMENTS", dict(opts.spargs), priority="cmdline")
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
        from crawler.hub import HubError  # (not at the top: see commands/proxies.py)

        if failure.check(UsageError, HubError):
            self._usage_error = str(failure.value)
            return None
        return failure

    def _on_done(self, task) -> None:
        from crawler.hub import HubError

        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, (UsageError, HubError)):
            self._usage_error = str(exc)
        elif exc is not None:
            logger.error("The crawl could not start", exc_info=exc)
