"""``scrapy job``: jobs in the hub, whose settings every crawl process of them follows."""

from __future__ import annotations

import argparse
import sys

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.utils.project import get_project_settings

from crawler.cli import CheckedSettings, pick_action, say_on_stderr, tidy_parser

ACTIONS = ("create", "set", "list", "show")


class Command(CheckedSettings, ScrapyCommand):
    # create's -s values are the job's: `run` says what it makes of each name.
    warn_unknown = False
    requires_project = False
    requires_crawler_process = False  # and so no version banner
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "create|set|list|show [arguments]"

    def short_desc(self) -> str:
        return "Jobs in the hub (HUB_URL): create, change, show"

    def long_desc(self) -> str:
        return (
            "  scrapy job create NAME --spider SPIDER [-s KEY=VALUE ...] [--urls FILE]\n"
            "  scrapy job set NAME KEY=VALUE ...\n"
            "  scrapy job list\n"
            "  scrapy job show NAME\n\n"
            "A job is a spider, its settings and a work queue, kept in the hub. `create` "
            "stores them (the -s settings are the job's, --urls loads its work queue); "
            "crawls started with -s JOB=NAME (or HUB_JOB=NAME) take the job's settings, "
            "command-line settings winning; `set` changes them, and running crawls apply "
            "concurrency, delay and proxy settings within JOB_REFRESH_SECONDS. `list` and "
            "`show` say what each job is and how far its queue is."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        tidy_parser(parser)
        parser.add_argument("--spider", help="the spider the job runs (create)")
        parser.add_argument("--urls", help="a URL list loaded into the job's queue (create)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        # (The hub here, not at the top: see commands/proxies.py.)
        from crawler.hub import Hub, HubError
        from crawler.hub.admin import JobAdmin
        from crawler.hub.db import hub_url
        from crawler.hub.jobchecks import JobSettingError, check_settings
        from crawler.hub.jobs import parse_assignments
        from crawler.hub.workqueue import unit_holders
        from crawler.spiderkit.start import fetchable_lines
        from crawler.spiderkit.urls import UrlList

        pick_action(args, ACTIONS)
        action, rest = args[0], args[1:]
        if action == "list" and rest or action in ("create", "show") and len(rest) != 1:
            raise UsageError(f"`job {action}`: see `scrapy job -h` for its arguments")
        if action == "set" and len(rest) < 2:
            raise UsageError("`job set NAME KEY=VALUE ...` takes a name and settings")
        if action == "create" and not opts.spider:
            raise UsageError("`job create NAME` needs --spider SPIDER")
        assert self.settings is not None
        try:
            given = {}
            if action == "create":
                given = parse_assignments(opts.set or [], "-s ")
            elif action == "set":
                given = parse_assignments(rest[1:])
            # The project's defaults: create's -s values are in self.settings too.
            for warning in check_settings(given, get_project_settings()):
                print(warning, file=sys.stderr)
        except JobSettingError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        except HubError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 1
            return
        urls = None
        if action == "create" and opts.urls:
            try:
                urls = fetchable_lines(UrlList(opts.urls), say_on_stderr)
            except UsageError as exc:  # an unreadable list: before the job is created
                print(f"error: {exc}", file=sys.stderr)
                self.exitcode = 1
                return
        try:
            with Hub.open(hub_url(self.settings, required=True)) as hub:
                admin = JobAdmin(hub)
                if action == "create":
                    partition = self.settings.get("CRAWL_PARTITION")
                    holders = unit_holders(self.settings)
                    print(admin.create(rest[0], opts.spider, given, urls, partition, holders))
                elif action == "set":
                    print(admin.set(rest[0], given))
                elif action == "list":
                    print(admin.list())
                else:
                    print(admin.show(rest[0]))
        except HubError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 1
