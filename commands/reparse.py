"""``scrapy reparse SPIDER``: run a spider's callback over the stored pages.

Exit status: 0 when every selected record was parsed, 1 when records were skipped
(corrupt or truncated) or a callback raised (the counts are printed), 2 for bad
arguments.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.utils.conf import arglist_to_dict

from crawler.cli import CheckedSettings, EndsWithoutTeardown, no_crawler_logging, tidy_parser

if TYPE_CHECKING:
    from crawler.reparse.plan import ReparseConfig


class Command(CheckedSettings, EndsWithoutTeardown, ScrapyCommand):
    # The items are committed (or the output file closed) and the worker pool has
    # ended when work() returns: what is left is the interpreter's teardown.

    requires_project = True
    requires_crawler_process = False  # and so no version banner
    default_settings = {"LOG_LEVEL": "WARNING"}

    def syntax(self) -> str:
        return "[options] <spider>"

    def short_desc(self) -> str:
        return "Run a spider's callback over stored pages (no network)"

    def long_desc(self) -> str:
        return (
            "Rebuild each stored response selected from the catalog and run the spider's "
            "callback on it, in parallel on every core. Items replace each page's items "
            "of the spider in the item tables of the catalog database, or go to -o FILE "
            "(jsonl, json, csv, xml or parquet, from the extension) instead. Nothing is "
            "fetched: requests the callback yields are counted and dropped.\n\n"
            "Exit status: 0 when every selected record was parsed, 1 when records were "
            "skipped or callbacks raised, 2 for bad arguments."
        )

    def add_options(self, parser) -> None:
        super().add_options(parser)
        tidy_parser(parser)
        parser.add_argument(
            "--archive",
            metavar="GLOB",
            help="archive files to read, relative to DATA_DIR (default every closed archive)",
        )
        parser.add_argument("--callback", default="parse", help="spider method (default: parse)")
        parser.add_argument(
            "-o",
            "--output",
            metavar="FILE",
            help="write items here (.jsonl .json .csv .xml .parquet) instead of the item tables",
        )
        parser.add_argument(
            "--workers", type=int, default=0, metavar="N", help="processes (default: all cores)"
        )
        parser.add_argument(
            "--where", metavar="SQL", help='select catalog rows, e.g. "status = 200"'
        )
        parser.add_argument("--limit", type=int, metavar="N", help="at most N records")
        parser.add_argument(
            "--follow",
            action="store_true",
            help="parse each page a running crawl commits, into the item tables, until "
            "stopped (Ctrl-C, SIGTERM); its position is kept across restarts",
        )
        parser.add_argument(
            "--until-idle",
            type=float,
            metavar="SECONDS",
            help="--follow: stop once no crawl holds the data directory and nothing new "
            "came for SECONDS",
        )
        parser.add_argument(
            "--items-db",
            metavar="FILE",
            help="--follow over a Slurm DATA/ (a DATA_DIR with catalogs/), the database "
            "the items and the position in each shipped catalog go to (default "
            "DATA_DIR/derived/items.db)",
        )
        parser.add_argument(
            "-a",
            dest="spargs",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="spider argument (may be repeated)",
        )

    def process_options(self, args, opts) -> None:
        super().process_options(args, opts)
        no_crawler_logging(self.settings, self.default_settings["LOG_LEVEL"])
        try:
            opts.spargs = arglist_to_dict(opts.spargs)
        except ValueError:
            raise UsageError("invalid -a value, use -a NAME=VALUE", print_help=False) from None

    def work(self, args, opts) -> None:
        # Imported here, not at the top: Scrapy imports every command module to run
        # any one of them, and a crawl has no use for the re-parse machinery.
        from crawler.reparse.feeds import FeedFormatError, check_output
        from crawler.reparse.plan import ReparseConfig, ReparseError
        from crawler.reparse.runner import Reparse
        from crawler.storage.datadir import DataDir
        from crawler.storage.errors import CatalogError

        if len(args) != 1:
            raise UsageError("give exactly one spider name", print_help=False)
        if opts.output:
            try:
                check_output(opts.output)
            except FeedFormatError as exc:
                raise UsageError(str(exc), print_help=False) from None
        if opts.follow and (opts.output or opts.where or opts.limit is not None or opts.archive):
            raise UsageError(
                "--follow writes into the item tables and reads every page the crawl "
                "commits: no -o, --where, --limit or --archive",
                print_help=False,
            )
        if opts.until_idle is not None and not opts.follow:
            raise UsageError("--until-idle goes with --follow", print_help=False)
        if opts.items_db and not opts.follow:
            raise UsageError("--items-db goes with --follow", print_help=False)
        if opts.limit is not None and opts.limit < 0:
            raise UsageError("--limit takes a number of 0 or more", print_help=False)
        datadir = DataDir.from_settings(self.settings)
        writes = not (opts.output or opts.items_db)
        # --follow may start before the crawl that makes the directory and its catalog
        # (or before a Slurm task's first shipment): it waits for them.
        waits = opts.follow and not datadir.root.exists()
        if not waits and (problem := datadir.unusable(write=writes, need_catalog=not opts.follow)):
            print(f"error: {problem}", file=sys.stderr)
            self.exitcode = 2  # nothing started: a usage problem (docs: exit statuses)
            return
        config = ReparseConfig(
            spider=args[0],
            data_dir=datadir.root,
            archive_glob=opts.archive,
            callback=opts.callback,
            output=Path(opts.output) if opts.output else None,
            workers=opts.workers,
            where=opts.where,
            limit=opts.limit,
            spider_args=opts.spargs,
            settings=overrides(self.settings),
        )
        if opts.follow:
            self._follow(config, opts.until_idle, Path(opts.items_db) if opts.items_db else None)
            return
        try:
            summary = Reparse(config).run()
        except (ReparseError, CatalogError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 1
            return
        for line in summary.lines():
            print(line, file=sys.stderr)
        if summary.exit_code:
            print(
                f"error: {summary.skipped} records skipped, {summary.callback_errors} "
                f"callback exceptions, {summary.item_errors} items not stored and "
                f"{summary.missing_files} archive files missing (see the messages above)",
                file=sys.stderr,
            )
        self.exitcode = summary.exit_code

    def _follow(
        self, config: ReparseConfig, until_idle: float | None, items_db: Path | None
    ) -> None:
        from crawler.reparse.follow import Follow
        from crawler.reparse.plan import ReparseError
        from crawler.storage.errors import CatalogError

        try:
            summary = Follow(config, until_idle, items_db=items_db).run()
        except (ReparseError, CatalogError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 1
            return
        for line in summary.lines():
            print(line, file=sys.stderr)
        self.exitcode = 1 if summary.problems else 0


def overrides(settings) -> dict:
    """The settings given on the command line, to pass to the worker processes."""
    return {name: settings[name] for name in settings if (settings.getpriority(name) or 0) >= 40}
