"""What the project's commands share: help that reads in an 80-column terminal, usage
errors in one line (exit 2), checked settings (crawler/settingspecs.py), and no version
banner for the commands that run no crawl."""

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
import warnings
from collections.abc import Mapping, Sequence
from typing import NoReturn

from scrapy.commands import ScrapyHelpFormatter
from scrapy.exceptions import UsageError
from scrapy.settings import SETTINGS_PRIORITIES, default_settings

from crawler import settingspecs
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


def setting_defaults() -> dict[str, object]:
    """Every setting's default: Scrapy's, then the project's (crawler/settings.py)."""
    from crawler import settings as project

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Scrapy's deprecated names warn when read
        known = {k: getattr(default_settings, k) for k in dir(default_settings) if k.isupper()}
    known.update({k: getattr(project, k) for k in dir(project) if k.isupper()})
    return known


def check_assignments(assignments: Sequence[str], warn_unknown: bool = True) -> None:
    """Check the ``-s NAME=VALUE`` of a command line before Scrapy reads them (it would
    refuse a dict setting's bad JSON without naming it): a bad value is a one-line
    UsageError (exit 2); a name that neither Scrapy nor the project knows is warned of
    on stderr, with the closest known name."""
    defaults = setting_defaults()
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        if not sep:
            continue  # Scrapy says how to write one
        try:
            settingspecs.check_value(name, value, defaults)
        except settingspecs.SettingValueError as exc:
            raise UsageError(f"setting {exc}", print_help=False) from None
        then = " (read by no part of the crawl but a spider that asks for it)"
        if warn_unknown and (warning := settingspecs.unknown_name(name, defaults, then)):
            print(f"warning: -s {warning}", file=sys.stderr)


def check_settings(settings, environ: Mapping[str, str] | None = None) -> None:
    """Check what a command's settings hold besides its ``-s`` (checked already:
    :func:`check_assignments`): the project's, and those the environment gives
    (``HUB_URL``...), each as crawler/settingspecs.py declares it, and the settings read
    together. A bad value is a one-line UsageError (exit 2)."""
    defaults = setting_defaults()
    project, cmdline = SETTINGS_PRIORITIES["project"], SETTINGS_PRIORITIES["cmdline"]
    given = {
        name: settings[name]
        for name in settings
        if project <= (settings.getpriority(name) or 0) < cmdline
    }
    environ = os.environ if environ is None else environ
    for name, value in settingspecs.from_environment(environ).items():
        if not settings.get(name):
            given[name] = value
    try:
        for name, value in given.items():
            settingspecs.check_value(name, value, defaults)
        settingspecs.check_combinations(lambda name: _checked(settings, name))
    except settingspecs.SettingValueError as exc:
        raise UsageError(f"setting {exc}", print_help=False) from None


def _checked(settings, name: str) -> object:
    value = settings.get(name)
    return None if value is None else settingspecs.check_value(name, value)


class CheckedSettings:
    """A command whose settings are checked (crawler/settingspecs.py) before it runs:
    put it before Scrapy's command class among the bases. ``warn_unknown`` False: the
    command says itself what it makes of a name (``scrapy job``)."""

    warn_unknown = True

    def process_options(self, args, opts) -> None:
        check_assignments(getattr(opts, "set", None) or [], self.warn_unknown)
        super().process_options(args, opts)
        check_settings(self.settings)


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
