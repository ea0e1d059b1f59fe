"""``scrapy catalog stats|verify|rebuild|merge|export|index|wacz``.

    scrapy catalog stats
    scrapy catalog verify [--fix] [--yes]
    scrapy catalog rebuild [-o OUT.db]
    scrapy catalog merge A.db B.db ... -o OUT.db
    scrapy catalog export --format parquet|csv [-o FILE]
    scrapy catalog export --table NAME --format parquet|csv|jsonl [-o FILE]
    scrapy catalog index [-o OUT.cdxj]
    scrapy catalog wacz [OUT.wacz]
    scrapy catalog report [-o report.html] [--watch SECONDS]

Exit status: 0 on success, 1 when verify found problems (or rebuild skipped unreadable
records), 2 for bad arguments.
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from crawler.cli import CheckedSettings, no_crawler_logging, pick_action, tidy_parser
from crawler.storage.datadir import DataDir
from crawler.storage.errors import CatalogError, StoreError

# The tools are imported by the actions that use them: Scrapy imports every command
# module to run any one of them, a crawl included, which needs none of these.

ACTIONS = ("stats", "verify", "rebuild", "merge", "export", "index", "wacz", "report")


# Errors of a place that cannot be written: a read-only data directory, a full disk.
UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


def os_error(exc: OSError) -> str:
    """One line for an OSError a tool met, naming the file."""
    where = exc.filename or "a file"
    if exc.errno in UNWRITABLE:
        return f"cannot write {where}: {exc.strerror} (write the output elsewhere with -o FILE)"
    return f"{where}: {exc.strerror or exc}"


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _print(lines) -> None:
    for line in lines:
        print(line)


class Command(CheckedSettings, ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # and so no version banner
    default_settings = {"LOG_LEVEL": "WARNING"}

    def syntax(self) -> str:
        return "<action> [options] [arguments]"

    def short_desc(self) -> str:
        return "Catalog stats, checks, rebuild, merge, export, WACZ and report"

    def long_desc(self) -> str:
        return """\
Actions:
- stats: rows by status, content type and host; bytes and compression
- verify [--fix] [--yes]: every row's record is readable and matches its
  digest, and nothing stored is missing from the catalog (--fix drops bad rows
  so their URLs are fetched again, and indexes missing records)
- rebuild [-o OUT.db]: a new catalog from the archives alone (default
  DATA_DIR/metadata.rebuilt.db)
- merge A.db B.db ... -o OUT.db: one catalog from several, the newest fetch
  winning
- export [--format parquet|csv] [-o FILE]: the catalog; with --table NAME an
  item table as Parquet, CSV or JSON lines (default under DATA_DIR/derived/)
- index [-o OUT.cdxj]: a sorted CDXJ index of the WARCs
- wacz [OUT.wacz] [--title TITLE]: WARCs + index + pages as a WACZ (default
  DATA_DIR/derived/crawl.wacz)
- report [-o FILE] [--watch SECONDS]: an HTML page of plots, one section per
  run (default DATA_DIR/derived/report.html; --watch rewrites it every SECONDS)

Exit status: 0 on success, 1 when verify found problems (or rebuild skipped
unreadable records), 2 for bad arguments."""

    def add_options(self, parser) -> None:
        from crawler.tools.export import EXPORT_FORMATS
        from crawler.tools.item_export import TABLE_FORMATS

        super().add_options(parser)
        tidy_parser(parser)
        parser.add_argument("-o", "--output", metavar="FILE", help="where to write the result")
        parser.add_argument("--fix", action="store_true", help="verify: repair what it finds")
        parser.add_argument("--yes", action="store_true", help="verify --fix: do not ask")
        parser.add_argument(
            "--format",
            choices=sorted({*EXPORT_FORMATS, *TABLE_FORMATS}),
            default="parquet",
            help="export format (jsonl: item tables only)",
        )
        parser.add_argument("--table", metavar="NAME", help="export: this item table")
        parser.add_argument("--title", help="wacz: the collection's title")
        parser.add_argument("--watch", type=float, metavar="SECONDS", help="report: rewrite it")

    def process_options(self, args, opts) -> None:
        super().process_options(args, opts)
        no_crawler_logging(self.settings, self.default_settings["LOG_LEVEL"])

    def run(self, args, opts) -> None:
        pick_action(args, ACTIONS)
        from crawler.tools.scan import ToolError

        self.datadir = DataDir.from_settings(self.settings)
        self.data_dir = self.datadir.root
        action, rest = args[0], args[1:]
        if action not in ("merge", "report") and (
            problem := self.datadir.unusable(
                check_catalog=action not in ("rebuild", "index", "wacz")
            )
        ):
            print(f"error: {problem}", file=sys.stderr)
            self.exitcode = 2  # nothing started: a usage problem (docs: exit statuses)
            return
        try:
            self.exitcode = getattr(self, f"do_{action}")(rest, opts) or 0
        except (ToolError, CatalogError, StoreError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 1
        except OSError as exc:
            print(f"error: {os_error(exc)}", file=sys.stderr)
            self.exitcode = 1

    def do_stats(self, rest, opts) -> int:
        from crawler.tools.item_export import item_table_lines
        from crawler.tools.stats import catalog_stats

        _print(catalog_stats(self.data_dir).lines())
        _print(item_table_lines(self.data_dir))
        return 0

    def do_verify(self, rest, opts) -> int:
        from crawler.tools.verify import Verify, confirm_prompt

        verify = Verify(self.data_dir)
        report = verify.run()
        if opts.fix and not report.ok:
            question = (
                f"Drop {len(report.bad_rows)} rows (their URLs will be fetched again) and "
                f"index {len(report.orphans)} records?"
            )
            if opts.yes or confirm_prompt(question):
                with self.datadir.lock():
                    verify.fix(report)
            else:
                print("not fixed (answer y, or pass --yes)", file=sys.stderr)
        _print(report.lines())
        fixed = report.dropped or report.reindexed or report.repaired
        return 0 if report.ok or fixed else 1

    def do_rebuild(self, rest, opts) -> int:
        from crawler.tools.rebuild import Rebuild

        result = Rebuild(self.data_dir, opts.output).run()
        for problem in result.problems:
            print(problem, file=sys.stderr)
        print(f"rebuilt {result.path}: {result.rows:,} rows from {result.records:,} records")
        return 1 if result.problems else 0

    def do_merge(self, rest, opts) -> int:
        from crawler.tools.rebuild import merge_catalogs

        if len(rest) < 2 or not opts.output:
            raise UsageError("give two or more catalogs and -o OUT.db", print_help=False)
        n = merge_catalogs([Path(p) for p in rest], Path(opts.output))
        print(f"merged {len(rest)} catalogs into {opts.output}: {n:,} rows")
        return 0

    def do_export(self, rest, opts) -> int:
        from crawler.tools.export import export_catalog
        from crawler.tools.item_export import export_table

        if opts.table:
            name = f"{opts.table}.{opts.format}"
            output = Path(opts.output or self.datadir.derived_dir / name)
            n = export_table(self.data_dir, opts.table, opts.format, output, _warn)
            print(f"exported {n:,} rows of {opts.table} to {output}")
            return 0
        output = Path(opts.output or self.datadir.derived_dir / f"catalog.{opts.format}")
        n = export_catalog(self.data_dir, opts.format, output)
        print(f"exported {n:,} rows to {output}")
        return 0

    def do_index(self, rest, opts) -> int:
        from crawler.tools.wacz import write_index

        output = Path(opts.output or self.datadir.derived_dir / "index.cdxj")
        n = write_index(self.data_dir, output)
        print(f"wrote {n:,} CDXJ lines to {output}")
        return 0

    def do_wacz(self, rest, opts) -> int:
        from crawler.tools.wacz import WaczBuilder

        target = rest[0] if rest else opts.output or self.datadir.derived_dir / "crawl.wacz"
        path = WaczBuilder(self.data_dir, Path(target), title=opts.title).run()
        print(f"wrote {path}")
        return 0

    def do_report(self, rest, opts) -> int:
        from crawler import report  # imports matplotlib: only for this action
        from crawler.hub import db as hub_db  # (not at the top: see commands/proxies.py)

        if opts.watch is not None and opts.watch <= 0:
            raise UsageError(
                "--watch takes the seconds between rewrites, more than 0", print_help=False
            )
        output = Path(opts.output or self.datadir.derived_dir / "report.html")
        hub_url = hub_db.hub_url(self.settings)
        shown = report.report_settings(self.settings.copy_to_dict().items(), hub_url)
        builder = report.ReportBuilder(self.data_dir, hub_url, shown)
        try:
            if opts.watch:
                return report.watch(builder, output, opts.watch)
            builder.write(output)
        except report.ReportError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {output}")
        return 0
