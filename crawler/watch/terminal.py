"""``scrapy job top``: the live view in a terminal, redrawn in place by Rich (``Live``
and ``Table``), or as plain lines when standard output is not a terminal (a pipe, a
file, a log), once per refresh.

In a terminal, keys change the view without a restart: ``s`` the next sort order,
``p`` only the problems (dead and stalled processes) or all, ``q`` quits (Ctrl-C too).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO

from crawler.admin import format_table
from crawler.hub.errors import HubError
from crawler.report.html import bytes_rate_text, size
from crawler.watch.model import (
    DEAD,
    FINISHED,
    STALLED,
    WAITING,
    JobView,
    ProcessView,
    Snapshot,
    ViewOptions,
    build,
)

PROCESS_HEADERS = (
    "node", "pid", "task", "state", "pages/s", "pages", "errors", "retries", "bans",
    "lag", "peak RSS", "hosts", "proxies", "beat", "why", "last error",
)  # fmt: skip
STYLES = {DEAD: "bold red", STALLED: "bold red", FINISHED: "dim"}
KEYS = "s: next sort  p: problems only / all  q: quit"


def summary_lines(view: JobView) -> list[str]:
    """The job's totals, its queue and ETA, each problem with its log: the lines above
    the table, in both views."""
    t = view.totals
    lines = [
        view.state_line(),
        f"pages {t.pages:,} ({t.pages_per_s:,.1f}/s, {bytes_rate_text(t.bytes_per_s)}); errors "
        f"{t.errors:,}, retries {t.retries:,}, bans {t.bans:,}, host waits "
        f"{t.host_waits:,}; storage lag {t.lag:,} rows",
    ]
    progress = []
    if t.list_total:
        progress.append(f"listed URLs {t.list_done:,}/{t.list_total:,} done")
    if view.snapshot.queue is not None:
        progress.append(
            f"queue {view.snapshot.queue_name!r}: {view.snapshot.queue.progress.line()}"
        )
    lines.append("; ".join([*progress, f"ETA {view.eta_text()}"]))
    for p in view.problems:
        lines.append(
            f"{p.state.upper()}: {p.name} (task {p.beat.task or '-'}): {p.why()}; read {p.log}"
        )
    return lines


def process_row(p: ProcessView) -> tuple[str, ...]:
    beat = p.beat
    proxies = p.proxies()
    return (
        beat.node,
        str(beat.pid),
        beat.task or "-",
        p.state,
        f"{p.pages_per_s:,.1f}",
        f"{beat.pages:,}",
        f"{beat.errors:,}",
        f"{beat.retries:,}",
        f"{beat.bans:,}",
        f"{beat.lag:,}",
        size(beat.rss),
        p.hosts_text(),
        ", ".join(proxies) if proxies else "-",
        f"{p.age:.0f} s ago",
        "" if p.problem else p.why(),  # a problem's line says it above, with its log
        _cut(p.last_error, 80),
    )


def host_rows(view: JobView) -> list[tuple[str, ...]]:
    return [
        (
            h.host,
            str(h.waiting),
            str(h.holders),
            f"{h.seconds:,.1f} s",
            str(h.episodes),
            h.reason or "-",
        )
        for h in view.hosts
    ]


def proxy_rows(view: JobView) -> list[tuple[str, ...]]:
    return [
        (p.label, p.state, str(p.bans), f"{p.requests:,}", ", ".join(p.holders) or "-")
        for p in view.proxies
    ]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


HOST_HEADERS = ("host", "waiting now", "processes holding it", "waited", "waits", "why")
PROXY_HEADERS = ("proxy", "state", "bans (1 h)", "requests (1 h)", "held by")


def plain(view: JobView) -> str:
    """The view as plain text: aligned columns, no colours, no escape codes."""
    parts = [view.title(), *summary_lines(view), ""]
    if not view.every:
        parts.append(no_processes(view))
    else:
        parts.append(f"processes ({view.options.describe()}):")
        parts.append(format_table(PROCESS_HEADERS, [process_row(p) for p in view.shown]))
    if view.hosts:
        parts += ["", "hosts most waited on:", format_table(HOST_HEADERS, host_rows(view))]
    if view.proxies:
        parts += ["", "proxies most banned:", format_table(PROXY_HEADERS, proxy_rows(view))]
    return "\n".join(parts)


def no_processes(view: JobView) -> str:
    who = f"of job {view.job!r} " if view.job is not None else ""
    return (
        f"no crawl process {who}has reported to this hub yet: crawls with HUB_URL set "
        "write a heartbeat every HEARTBEAT_SECONDS"
    )


def rich_view(view: JobView, keys: bool):
    """The view as Rich renderables: the summary, then tables, a state's colour on
    its process row."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    items: list = [Text(view.title(), style="bold")]
    for line in summary_lines(view):
        red = line.startswith((DEAD.upper(), STALLED.upper()))
        items.append(Text(line, style="red" if red else ""))
    if not view.every:
        items.append(Text(no_processes(view), style="yellow"))
    else:
        table = Table(
            title=f"processes ({view.options.describe()})", title_justify="left", expand=False
        )
        for header in PROCESS_HEADERS:
            table.add_column(
                header, justify="right" if header in _NUMERIC else "left", overflow="fold"
            )
        for p in view.shown:
            style = STYLES.get(p.state, "yellow" if p.state in WAITING else "")
            table.add_row(*process_row(p), style=style)
        items.append(table)
    for name, headers, rows in (
        ("hosts most waited on", HOST_HEADERS, host_rows(view)),
        ("proxies most banned", PROXY_HEADERS, proxy_rows(view)),
    ):
        if rows:
            table = Table(*headers, title=name, title_justify="left")
            for row in rows:
                table.add_row(*row)
            items.append(table)
    if keys:
        items.append(Text(KEYS, style="dim"))
    return Group(*items)


_NUMERIC = {"pid", "pages/s", "pages", "errors", "retries", "bans", "lag", "peak RSS", "beat"}


class Top:
    """Reads the hub every ``interval`` seconds and draws the view: ``iterations``
    times (None: until ``q`` or Ctrl-C)."""

    def __init__(
        self,
        read: Callable[[], Snapshot],
        options: ViewOptions,
        interval: float = 2.0,
        iterations: int | None = None,
        out: IO[str] | None = None,
    ) -> None:
        self.read = read
        self.options = options
        self.interval = interval
        self.iterations = iterations
        self.out = out or sys.stdout

    def run(self) -> int:
        """Draw until done; the exit status (1: the hub failed at the first read)."""
        if self.out.isatty():
            return self._live()
        return self._plain()

    def _plain(self) -> int:
        count = 0
        while True:
            try:
                view = build(self.read(), self.options)
            except HubError as exc:
                if count == 0:
                    raise
                print(f"error: {exc}", file=self.out, flush=True)
            else:
                print(plain(view), file=self.out, flush=True)
            count += 1
            if self.iterations is not None and count >= self.iterations:
                return 0
            time.sleep(self.interval)
            print(file=self.out)

    def _live(self) -> int:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        console = Console(file=self.out)
        snapshot = self.read()  # a hub that fails at once: the command says so, exit 1
        count = 0
        with _keys() as key, Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                live.update(
                    rich_view(build(snapshot, self.options), keys=key is not None), refresh=True
                )
                count += 1
                if self.iterations is not None and count >= self.iterations:
                    return 0
                pressed = _wait(key, self.interval)
                if pressed == "q":
                    return 0
                if pressed == "s":
                    self.options = self.options.next_sort()
                    continue  # drawn again at once, from the same rows
                if pressed == "p":
                    self.options = self.options.toggle_problems()
                    continue
                try:
                    snapshot = self.read()
                except HubError as exc:
                    live.update(
                        Text(f"error: {exc}; trying again in {self.interval:g} s", style="red"),
                        refresh=True,
                    )
        return 0  # Ctrl-C


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str | None] | None]:
    """A function that waits up to N seconds for a key (None: no terminal to read keys
    from), with the terminal in cbreak mode meanwhile; Ctrl-C ends the view quietly."""
    stdin = sys.stdin
    reader = None
    saved = None
    try:
        if stdin is not None and stdin.isatty():
            import termios
            import tty

            fd = stdin.fileno()
            saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)

            def reader(timeout: float) -> str | None:
                ready, _, _ = select.select([fd], [], [], timeout)
                return os.read(fd, 1).decode("utf-8", "replace").lower() if ready else None

        yield reader
    except KeyboardInterrupt:
        pass
    finally:
        if saved is not None:
            import termios

            termios.tcsetattr(stdin.fileno(), termios.TCSADRAIN, saved)


def _wait(key: Callable[[float], str | None] | None, seconds: float) -> str | None:
    if key is None:
        time.sleep(seconds)
        return None
    return key(seconds)
