"""``scrapy proxies``: manage the hub's shared proxy pool."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from crawler.cli import CheckedSettings, pick_action, tidy_parser

if TYPE_CHECKING:
    from crawler.admin import ProxyAdmin

ACTIONS = ("add", "import", "list", "disable", "enable", "unban", "stats")


class Command(CheckedSettings, ScrapyCommand):
    requires_project = False
    requires_crawler_process = False  # and so no version banner
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "add|import|list|disable|enable|unban|stats [arguments]"

    def short_desc(self) -> str:
        return "Manage the shared proxy pool in the hub (HUB_URL)"

    def long_desc(self) -> str:
        return (
            "  scrapy proxies add URL ...\n"
            "  scrapy proxies import FILE\n"
            "  scrapy proxies list\n"
            "  scrapy proxies disable|enable ID|URL\n"
            "  scrapy proxies unban ID|URL|--all\n"
            "  scrapy proxies stats\n\n"
            "Manage the proxies that crawls lease from the hub named by the HUB_URL setting "
            "or environment variable. URLs are shown with their passwords as ***. "
            "disable/enable/unban take an id or a URL as `list` shows it. A banned proxy "
            "rests until its ban ends; `unban` lifts the ban at once (`unban --all`: every "
            "banned proxy). `enable` only undoes `disable`: it does not lift a ban."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--all", dest="all", action="store_true", help="unban: every banned proxy"
        )
        tidy_parser(parser)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        pick_action(args, ACTIONS)
        action, rest = args[0], args[1:]
        if opts.all and action != "unban":
            raise UsageError("--all goes with `proxies unban` only")
        if action == "unban" and bool(rest) == opts.all:
            raise UsageError("`proxies unban` takes one proxy (an id or a URL) or --all")
        expected = {"add": None, "import": 1, "list": 0, "disable": 1, "enable": 1, "stats": 0}
        want = expected.get(action, len(rest))
        if (want is None and not rest) or (want is not None and len(rest) != want):
            raise UsageError(
                f"`proxies {action}` takes {want if want is not None else '1+'} argument(s)"
            )
        # The hub here, not at the top: Scrapy imports every command's module to run any
        # one of them, and most commands have no use for the hub.
        from crawler.admin import ProxyAdmin, ProxyFileError
        from crawler.hub import Hub, HubError, ProxyPool
        from crawler.hub.db import hub_url
        from crawler.hub.errors import InvalidProxyURLError

        assert self.settings is not None
        try:
            url = hub_url(self.settings, required=True)
        except HubError as exc:  # no HUB_URL: a usage error
            raise UsageError(str(exc)) from None
        try:
            with Hub.open(url) as hub:
                print(self._dispatch(ProxyAdmin(ProxyPool(hub)), action, rest))
        except (InvalidProxyURLError, ProxyFileError) as exc:
            # A bad argument (a proxy URL, a line of the list): nothing was changed.
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
        except HubError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 1

    @staticmethod
    def _dispatch(admin: ProxyAdmin, action: str, rest: list[str]) -> str:
        if action == "add":
            return admin.add(rest)
        if action == "import":
            return admin.import_file(rest[0])
        if action == "unban":
            return admin.unban(rest[0] if rest else None)
        if action in ("disable", "enable"):
            return admin.set_enabled(rest[0], action == "enable")
        return admin.list() if action == "list" else admin.stats()
