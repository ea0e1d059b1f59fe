"""What the project's commands share: help that reads in an 80-column terminal, usage
errors in one line (exit 2), checked command-line settings, and no version banner for
the commands that run no crawl."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from scrapy.commands import ScrapyHelpFormatter
from scrapy.exceptions import UsageError
from scrapy.settings import default_settings

from crawler.helptext import fill

EXIT_USAGE = 2

# argparse's section titles ("Options:", "Global Options:"). Scrapy's formatter takes
# any part ending in a colon for one, an option's help line that wraps after a colon
# included, and title-cases and underlines it.
_HEADING = re.compile(r"[A-Za-z][A-Za-z ]*:\n")


class HelpFormatter(ScrapyHelpFormatter):
    """Scrapy's help layout, keeping the description's paragraphs, bullets ("- ") and
    indented example lines apart instead of running them into one paragraph."""

    def format_part_strings(self, part_strings: list[str]) -> list[str]:
        # Hide every colon-ended line from Scrapy's heading rule, then give the real
        # section titles back to it.
        guarded = [p if _HEADING.fullmatch(p) else p.replace(":\n", ":\0") for p in part_strings]
        return [p.replace(":\0", ":\n") for p in super().format_part_strings(guarded)]

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return fill(text, width, indent)


def say_on_stderr(line: str) -> None:
    """Tell the user *line* beside a command's output (a line it left out, say)."""
    print(line, file=sys.stderr)


def tidy_parser(parser: argparse.ArgumentParser) -> None:
    """Use the project's help layout and one-line usage errors on ``parser``.

    Called from a command's ``add_options``: Scrapy builds the parser before, and
    parses the arguments after.
    """
    parser.formatter_class = HelpFormatter
    prog = parser.usage.split(" [", 1)[0].split(" <", 1)[0] if parser.usage else "scrapy"
    name = " ".join(prog.split()[:2])

    def error(message: str):
        # argparse prints the whole usage before its message; one line is easier to
        # read, and to find in a job's log.
        print(f"error: {message} (see `{name} -h`)", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    parser.error = error  # type: ignore[method-assign]


def pick_action(args: Sequence[str], actions: Sequence[str]) -> str:
    """The action ``args`` start with, or a UsageError naming what is wrong."""
    if not args:
        raise UsageError(f"give an action: {', '.join(actions)}", print_help=False)
    if args[0] not in actions:
        raise UsageError(
            f"unknown action {args[0]!r}: give one of {', '.join(actions)}", print_help=False
        )
    # Scrapy parses with parse_known_args: an option no command knows (a typo) would
    # end up among the arguments and be ignored.
    unknown = [arg for arg in args[1:] if arg.startswith("-") and arg != "-"]
    if unknown:
        raise UsageError(f"unknown option {unknown[0]!r}", print_help=False)
    return args[0]


# Integers as numbers: Scrapy reads some settings whose default is 0 as floats
# (DOWNLOAD_DELAY=0.5).
_CONVERTERS = {bool: "getbool", int: "getfloat", float: "getfloat"}
_TYPE_NAMES = {bool: "True or False", int: "a number", float: "a number"}


def check_setting_types(settings, defaults: Sequence[object] = ()) -> None:
    """Raise a UsageError naming the first command-line setting (``-s``) whose value
    does not convert to the type of its default (a number, a boolean): the crawl
    would fail later with a traceback naming neither.

    ``defaults`` are modules or objects whose upper-case attributes are defaults, after
    Scrapy's own.
    """
    known: dict[str, object] = {}
    for source in (default_settings, *defaults):
        known.update({k: getattr(source, k) for k in dir(source) if k.isupper()})
    for name in settings:
        if (settings.getpriority(name) or 0) < 40 or name not in known:
            continue
        kind = type(known[name])
        if kind not in _CONVERTERS:
            continue
        try:
            getattr(settings, _CONVERTERS[kind])(name)
        except (TypeError, ValueError):
            raise UsageError(
                f"setting {name}={settings[name]!r}: expected {_TYPE_NAMES[kind]}",
                print_help=False,
            ) from None


def no_crawler_logging(settings, level: str = "WARNING") -> None:
    """Logging for a command that runs no crawl: Scrapy's format, without the version
    banner a crawler process logs, at ``level`` unless -L or -s LOG_LEVEL says."""
    from scrapy.utils.log import configure_logging

    if (settings.getpriority("LOG_LEVEL") or 0) < 40:
        settings.set("LOG_LEVEL", level, priority="cmdline")
    configure_logging(settings)


class EndsWithoutTeardown:
    """A command whose :meth:`work` leaves nothing to the interpreter's teardown (its
    files committed and closed, its pools ended): the process ends once it returns
    (:func:`exit_now`), except under ``--profile``."""

    def run(self, args, opts) -> None:
        self.work(args, opts)
        if not opts.profile:
            exit_now(self.exitcode)

    def work(self, args, opts) -> None:
        raise NotImplementedError


def exit_now(code: int, sig: int | None = None) -> NoReturn:
    """End the process as the interpreter ends one, with status ``code`` (or killed by
    ``sig``): its non-daemon threads joined, ``atexit`` run (log handlers flushed among
    them), stdout and stderr flushed; but without the teardown that frees every object
    and module one by one, which nothing a command leaves depends on (as many
    instructions as parsing six stored pages; a second after a crawl on a loaded node:
    the history of docs/benchmarks.md). ``multiprocessing``'s children end without it too.

    Not under Scrapy's ``--profile``, whose statistics are written after the command
    returns.
    """
    threading._shutdown()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe, a closed file
            stream.flush()
    if sig is not None:
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(code)
