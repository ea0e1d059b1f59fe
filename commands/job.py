"""``scrapy job``: jobs in the hub, whose settings every crawl process of them follows."""

from __future__ import annotations

import argparse
import os
import sys

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.utils.project import get_project_settings

from crawler.cli import CheckedSettings, pick_action, say_on_stderr, tidy_parser

ACTIONS = ("create", "set", "list", "show", "top", "serve")
WATCH = ("top", "serve")


class Command(CheckedSettings, ScrapyCommand):
    # create's -s values are the job's: `run` says what it makes of each name.
    warn_unknown = False
    requires_project = False
    requires_crawler_process = False  # and so no version banner
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "create|set|list|show|top|serve [arguments]"

    def short_desc(self) -> str:
        return "Jobs in the hub (HUB_URL): create, change, show, watch live"

    def long_desc(self) -> str:
        return (
            "  scrapy job create NAME --spider SPIDER [-s KEY=VALUE ...] [--urls FILE]\n"
            "  scrapy job set NAME KEY=VALUE ...\n"
            "  scrapy job list\n"
            "  scrapy job show NAME\n"
            "  scrapy job top [NAME] [--sort KEY] [--state STATES] [--node GLOB]\n"
            "  scrapy job serve [NAME] [--port N] [--bind ADDRESS --token TOKEN]\n\n"
            "A job is a spider, its settings and a work queue, kept in the hub. `create` "
            "stores them (the -s settings are the job's, --urls loads its work queue); "
            "crawls started with -s JOB=NAME (or HUB_JOB=NAME) take the job's settings, "
            "command-line settings winning; `set` changes them, and running crawls apply "
            "concurrency, delay and proxy settings within JOB_REFRESH_SECONDS. `list` and "
            "`show` say what each job is and how far its queue is.\n\n"
            "`top` shows every crawl process of the job (of every job, without NAME) "
            "from their heartbeats in the hub: the job's totals and ETA, one line per "
            "process (node, task, pages/s, errors, bans, state: fetching, waiting for a "
            "host or a proxy, stalled, dead, with the log to read), the hosts most "
            "waited on and the proxies most banned. In a terminal it redraws in place "
            "(keys: s sorts, p shows problems only, q quits); otherwise it prints the "
            "view once as plain lines (--iterations N: N times). `serve` serves the same "
            "view as a page that refreshes itself, on 127.0.0.1 unless --bind says "
            "otherwise, which needs a --token (or JOB_SERVE_TOKEN) that readers bring "
            "in the URL. Exit status: 0; 1 the hub failed; 2 bad arguments, an unknown "
            "job."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        tidy_parser(parser)
        parser.add_argument("--spider", help="the spider the job runs (create)")
        parser.add_argument("--urls", help="a URL list loaded into the job's queue (create)")
        parser.add_argument(
            "--sort", help="top, serve: order of the processes: state (problems first), "
            "node, task, rate, errors, bans, lag, rss"
        )  # fmt: skip
        parser.add_argument(
            "--state", help="top, serve: only processes in these states, comma-separated: "
            "dead, stalled, waiting, proxy, host, fetching, idle, finished, problems, live"
        )  # fmt: skip
        parser.add_argument(
            "--node", action="append", default=[], metavar="GLOB",
            help="top, serve: only processes of nodes matching GLOB (repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--window", type=float, default=3600.0, metavar="SECONDS",
            help="top, serve: processes heard from within SECONDS of the job's last "
            "heartbeat (default 3600)",
        )  # fmt: skip
        parser.add_argument(
            "--interval", type=float, metavar="SECONDS",
            help="top, serve: seconds between refreshes (top 2, serve 5)",
        )  # fmt: skip
        parser.add_argument(
            "--iterations", type=int, metavar="N",
            help="top: refresh N times, then exit (default: 1 when not in a terminal)",
        )  # fmt: skip
        parser.add_argument(
            "--port", type=int, default=8080, help="serve: port (default 8080; 0: any free)"
        )
        parser.add_argument(
            "--bind", default="127.0.0.1", metavar="ADDRESS",
            help="serve: address to listen on (default 127.0.0.1); another needs --token",
        )  # fmt: skip
        parser.add_argument(
            "--token", help="serve: a secret readers must bring (?token=...); default "
            "the JOB_SERVE_TOKEN environment variable",
        )  # fmt: skip

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        # (The hub here, not at the top: see commands/proxies.py.)
        from crawler.admin import JobAdmin
        from crawler.hub import Hub, HubError
        from crawler.hub.db import hub_url
        from crawler.hub.jobchecks import JobSettingError, check_settings
        from crawler.hub.jobs import parse_assignments
        from crawler.hub.workqueue import unit_holders
        from crawler.spiderkit.start import fetchable_lines
        from crawler.spiderkit.urls import UrlList

        pick_action(args, ACTIONS)
        action, rest = args[0], args[1:]
        if action in WATCH:
            self.exitcode = self.watch(action, rest, opts)
            return
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

    def watch(self, action: str, rest: list[str], opts: argparse.Namespace) -> int:
        """``top`` and ``serve``: the exit status."""
        from crawler.hub import Hub, HubError
        from crawler.hub.db import hub_url
        from crawler.watch.model import ViewError, ViewOptions, build
        from crawler.watch.server import is_loopback, serve
        from crawler.watch.source import JobSource, UnknownJobError
        from crawler.watch.terminal import Top

        if len(rest) > 1:
            raise UsageError(f"`job {action}` takes one job NAME at most", print_help=False)
        if opts.interval is not None and opts.interval <= 0:
            raise UsageError("--interval: give seconds > 0", print_help=False)
        if opts.iterations is not None and opts.iterations < 1:
            raise UsageError("--iterations: give a number >= 1", print_help=False)
        try:
            options = ViewOptions.parse(opts.sort, opts.state, opts.node)
        except ViewError as exc:
            raise UsageError(str(exc), print_help=False) from None
        token = opts.token or os.environ.get("JOB_SERVE_TOKEN") or None
        if action == "serve" and not is_loopback(opts.bind) and not token:
            raise UsageError(
                f"--bind {opts.bind} lets other machines read the page: give --token "
                "TOKEN (or set JOB_SERVE_TOKEN), which they must bring in its URL",
                print_help=False,
            )
        assert self.settings is not None
        name = rest[0] if rest else None
        try:
            with Hub.open(hub_url(self.settings, required=True)) as hub:
                source = JobSource(hub, name, opts.window)
                if action == "top":
                    iterations = opts.iterations or (None if sys.stdout.isatty() else 1)
                    return Top(source.snapshot, options, opts.interval or 2.0, iterations).run()
                serve(
                    lambda: build(source.snapshot(), options),
                    opts.bind,
                    opts.port,
                    token,
                    opts.interval or 5.0,
                    lambda url: print(
                        f"Serving the live view at {url} (read-only; Ctrl-C stops it)", flush=True
                    ),
                )
                return 0
        except UnknownJobError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except HubError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:  # the port is taken, the address is not this machine's
            print(
                f"error: cannot serve on {opts.bind}:{opts.port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
