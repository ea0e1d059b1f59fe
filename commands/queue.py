"""``scrapy queue``: load URL lists into the hub's work queues and watch their progress."""

from __future__ import annotations

import argparse
import sys

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from crawler.cli import CheckedSettings, pick_action, say_on_stderr, tidy_parser
from crawler.partition import MODES, PartitionError, check_mode

ARGUMENTS = {"load": 2, "status": 1, "stats": 1, "requeue": 1}


class Command(CheckedSettings, ScrapyCommand):
    requires_project = False
    requires_crawler_process = False  # and so no version banner
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "load|status|stats|requeue NAME [URLS|-]"

    def short_desc(self) -> str:
        return "Load a URL list into a hub work queue (HUB_URL); show progress"

    def long_desc(self) -> str:
        return (
            "  scrapy queue load NAME URLS|- [--partition domain|host|url]\n"
            "  scrapy queue status NAME\n"
            "  scrapy queue stats NAME\n"
            "  scrapy queue requeue NAME\n\n"
            "Work queues feed the Slurm queue mode (slurm/submit --queue): tasks lease "
            "batches of URLs from them. `load` adds a URL list (one URL a line, - for "
            "standard input) to the queue NAME, created if new; loading the same list "
            "again adds nothing. A line that is not a URL a crawl fetches is left out and "
            "said on standard error with its file and line number, as the crawl says it. Each URL is loaded with its partition unit (--partition, "
            "default the CRAWL_PARTITION setting: domain): a batch holds one unit's URLs "
            "and a unit's batches are leased to one task at a time, so that one process "
            "at a time fetches a site, or to as many as its host budget lets ask at once "
            "(CONCURRENT_REQUESTS_PER_DOMAIN with HOST_BUDGET_ENABLED, the default); "
            "url: batches of any URLs. `status` shows how many "
            "URLs are done, leased, expired, pending and failed; `stats` adds failures, the speed over the last 10 minutes, the ETA "
            "and the batches each host holds. A URL whose crawl failed (an error after every "
            "retry) goes back to the queue, up to WORK_MAX_ATTEMPTS times in all; `requeue` "
            "puts the ones that failed that often back to pending. The hub is named by the HUB_URL setting or "
            "environment variable."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--partition",
            choices=MODES,
            help="load: what a batch takes whole (default: the CRAWL_PARTITION setting)",
        )
        tidy_parser(parser)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        pick_action(args, list(ARGUMENTS))
        action, rest = args[0], args[1:]
        if len(rest) != ARGUMENTS[action]:
            raise UsageError(f"`queue {action}` takes {ARGUMENTS[action]} argument(s)")
        # (The hub here, not at the top: see commands/proxies.py.)
        from crawler.admin import QueueAdmin
        from crawler.hub import Hub, HubError
        from crawler.hub.db import hub_url
        from crawler.hub.workqueue import unit_holders

        assert self.settings is not None
        try:
            url = hub_url(self.settings, required=True)
        except HubError as exc:  # no HUB_URL: a usage error
            raise UsageError(str(exc)) from None
        try:
            with Hub.open(url) as hub:
                admin = QueueAdmin(hub)
                if action == "load":
                    partition = opts.partition or self.settings.get("CRAWL_PARTITION")
                    holders = unit_holders(self.settings)
                    print(admin.load(*rest, check_mode(partition), holders, say_on_stderr))
                elif action == "stats":
                    print(admin.stats(*rest))
                elif action == "requeue":
                    print(admin.requeue(*rest))
                else:
                    print(admin.status(*rest))
        except PartitionError as exc:
            raise UsageError(str(exc)) from None
        except HubError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 1
