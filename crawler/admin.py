"""Managing the hub: the logic behind ``scrapy proxies``, ``scrapy queue`` and ``scrapy job``."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from crawler.hub.db import Hub
from crawler.hub.errors import HubError, InvalidProxyURLError
from crawler.hub.jobs import Job, JobStore
from crawler.hub.proxies import ProxyPool
from crawler.hub.redact import normalize_proxy_url
from crawler.hub.workqueue import WorkQueue, WorkQueueError


class ProxyFileError(HubError):
    """A proxy list file cannot be read or holds a malformed line."""


def read_proxy_file(path: str | os.PathLike[str]) -> list[str]:
    """Proxy URLs from a file, one a line; blank lines and ``#`` comments are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProxyFileError(f"cannot read the proxy list {path}: {exc.strerror}") from None
    urls = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            urls.append(normalize_proxy_url(line))
        except InvalidProxyURLError as exc:
            raise ProxyFileError(f"{path}, line {number}: {exc}") from None
    return urls


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain text table with left-aligned columns."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1%}" if value <= 1 else f"{value:g}"
    return str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{float(value):.1f} s"


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _when(ts: float | None, now: float) -> str:
    if ts is None or ts <= now:
        return "-"
    left = ts - now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    return f"{stamp} (in {int(left)} s)"


class ProxyAdmin:
    """Add, list, enable, disable proxies and report their use; every URL shown redacted."""

    def __init__(self, pool: ProxyPool) -> None:
        self.pool = pool
        self.hub = pool.hub

    def add(self, urls: Iterable[str]) -> str:
        added, known = self.pool.add(urls)
        return f"added {added} proxies, {known} already in the hub {self.hub.label}"

    def import_file(self, path: str) -> str:
        return self.add(read_proxy_file(path))

    def set_enabled(self, ref: str, enabled: bool) -> str:
        """Enable or disable a proxy. Enabling does not lift a ban (the hub's verdict, not
        the operator's switch): the answer says so when the proxy is banned."""
        row = self.pool.find(ref)
        self.pool.set_enabled(row.id, enabled)
        done = f"proxy #{row.id} {row.label} {'enabled' if enabled else 'disabled'}"
        now = self.hub.now()
        if not (enabled and row.state == "banned" and (row.resting_until or 0) > now):
            return done
        return (
            f"{done}; it stays banned until {_when(row.resting_until, now)}: enabling does "
            f"not lift a ban, `scrapy proxies unban {row.id}` does"
        )

    def unban(self, ref: str | None) -> str:
        """Lift the ban of one proxy (*ref*), or of every banned proxy (None)."""
        if ref is None:
            lifted = self.pool.unban()
            return f"lifted the ban of {len(lifted)} proxies in the hub {self.hub.label}"
        row = self.pool.find(ref)
        if self.pool.unban(row.id):
            return f"proxy #{row.id} {row.label}: ban lifted, it may be leased at once"
        return f"proxy #{row.id} {row.label} was not banned"

    def list(self) -> str:
        now = self.hub.now()
        rows = [
            (
                row.id,
                row.label,
                row.effective_state(now),
                row.holder if row.effective_state(now) == "leased" else None,
                row.stretch_uses,
                row.total_uses,
                row.failures,
                row.bans,
                _when(row.resting_until, now),
            )
            for row in self.pool.proxies()
        ]
        if not rows:
            return f"no proxies in the hub {self.hub.label}: add some with `scrapy proxies add URL`"
        headers = ("id", "proxy", "state", "holder", "stretch", "uses", "failures", "bans")
        return format_table((*headers, "resting until"), rows)

    def stats(self, window: float = 3600.0) -> str:
        """The pool by state, leases per host with the wait for a proxy over the last
        *window* seconds, then each proxy's totals."""
        now = self.hub.now()
        states = Counter(row.effective_state(now) for row in self.pool.proxies())
        summary = ", ".join(f"{n:,} {state}" for state, n in sorted(states.items()))
        hosts = [
            (
                h["host"],
                int(h["held"] or 0),
                int(h["leases"] or 0),
                int(h["requests"] or 0),
                _seconds(h["wait_mean"]),
                _seconds(h["wait_max"]),
            )
            for h in self.pool.host_stats(now - window)
        ]
        parts = [f"proxies in {self.hub.label}: {summary or 'none'}"]
        if hosts:
            headers = ("host", "held now", "leases", "requests", "wait mean", "wait max")
            parts += [f"\nper host, last {window / 60:g} min:", format_table(headers, hosts)]
        return "\n".join(parts + ["", self._proxy_table()])

    def _proxy_table(self) -> str:
        rows = [
            (
                item["id"],
                item["label"],
                "yes" if item["enabled"] else "no",
                item["leases"],
                item["requests"],
                item["bytes"],
                item["failures"],
                item["bans"],
                f"{item['ban_rate']:.1%}",
            )
            for item in self.pool.usage_stats()
        ]
        if not rows:
            return f"no proxies in the hub {self.hub.label}"
        headers = ("id", "proxy", "enabled", "leases", "requests", "bytes", "failures", "bans")
        return format_table((*headers, "ban rate"), rows)


class QueueAdmin:
    """Load URL lists into the hub's work queues and report their progress."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def load(
        self,
        name: str,
        path: str,
        partition: str = "url",
        holders: int = 1,
        skipped: Callable[[str], None] | None = None,
    ) -> str:
        """Add the list at *path* (``-``: standard input) to queue *name* (created if
        new), each batch to hold one *partition* unit's URLs, each unit leased to
        *holders* at once; what it did, and the queue's progress.

        A line that is not a URL a crawl fetches is left out, and told to *skipped* as
        the crawl tells it (``Skipped line FILE:N: why: 'text'``)."""
        from scrapy.exceptions import UsageError

        from crawler.spiderkit.start import fetchable_lines
        from crawler.spiderkit.urls import UrlList

        try:
            urls = UrlList(path)
        except UsageError as exc:  # cannot be read
            raise WorkQueueError(str(exc)) from None
        bad = 0

        def skip(line: str) -> None:
            nonlocal bad
            bad += 1
            if skipped is not None:
                skipped(line)

        said = self.load_lines(name, fetchable_lines(urls, skip), partition, holders)
        if bad:
            said += f"\nqueue {name!r}: {bad:,} lines of {urls.name} left out: not URLs to fetch"
        return said

    def load_lines(
        self, name: str, urls: Iterable[str], partition: str = "url", holders: int = 1
    ) -> str:
        """Add *urls* to queue *name* (created if new); what it did, and its progress."""
        queue = WorkQueue(self.hub, name)
        added, present = queue.load(urls, partition=partition, holders=holders)
        at_once = "one holder" if holders == 1 else f"up to {holders} holders"
        split = (
            "batches of any URLs"
            if queue.partition == "url"
            else f"a batch per {queue.partition}, leased to {at_once} at a time"
        )
        return (
            f"queue {name!r} in {self.hub.label}: {added:,} URLs added, {present:,} already there\n"
            f"queue {name!r}: {queue.progress().line()}\n"
            f"queue {name!r}: {split}"
        )

    def status(self, name: str) -> str:
        """Done, leased, expired and pending counts of queue *name*."""
        queue = WorkQueue(self.hub, name, create=False)
        return f"queue {name!r}: {queue.progress().line()}"

    def requeue(self, name: str) -> str:
        """Put the failed URLs of queue *name* back to pending."""
        count = WorkQueue(self.hub, name, create=False).requeue()
        return f"queue {name!r}: {count:,} failed URL(s) pending again"

    def stats(self, name: str, window: float = 600.0) -> str:
        """Progress, failures, speed and ETA of queue *name*, and who holds its batches."""
        stats = WorkQueue(self.hub, name, create=False).stats(window)
        p = stats.progress
        eta = stats.eta
        lines = [
            f"queue {name!r} in {self.hub.label}",
            f"URLs: {p.total:,} total, {p.pending:,} pending, {p.leased:,} leased, "
            f"{p.expired:,} under expired leases, {p.done:,} done, {p.failed:,} failed "
            f"for good ({stats.failed:,} failed attempts put back or kept)",
            f"speed: {stats.rate:,.1f} URLs/s over the last {duration(stats.window)}; ETA "
            + (
                "done"
                if eta == 0
                else "unknown (nothing done lately)"
                if eta is None
                else duration(eta)
            ),  # fmt: skip
        ]
        if stats.held_by_host:
            rows = [(h, n, urls) for h, (n, urls) in sorted(stats.held_by_host.items())]
            lines += ["", format_table(("host", "leases", "URLs"), rows)]
        return "\n".join(lines)


class JobAdmin:
    """Create, change and describe the hub's jobs (``scrapy job``)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.store = JobStore(hub)

    def create(
        self,
        name: str,
        spider: str,
        settings: dict[str, str],
        urls: Iterable[str] | None = None,
        partition: str = "url",
        holders: int = 1,
    ) -> str:
        """Create job *name*; *urls*, the URLs of its work queue (checked already), a
        batch of it per *partition* unit, leased to *holders* at once."""
        job = self.store.create(name, spider, settings, queue=name if urls is not None else "")
        lines = [f"job {name!r} created in {self.hub.label}: spider {spider!r}"]
        if urls is not None:
            lines.append(QueueAdmin(self.hub).load_lines(job.queue, urls, partition, holders))
        return "\n".join(lines + [_settings_line(job)])

    def set(self, name: str, settings: dict[str, str]) -> str:
        job = self.store.set(name, settings)
        changed = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
        return f"job {name!r} version {job.version}: {changed}"

    def list(self) -> str:
        jobs = self.store.jobs()
        if not jobs:
            return f"no jobs in {self.hub.label} (create one with `scrapy job create`)"
        return "\n".join(f"{job.name}: spider {job.spider}, {self._progress(job)}" for job in jobs)

    def show(self, name: str) -> str:
        job = self.store.get(name)
        updated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(job.updated))
        return "\n".join(
            [
                f"job {job.name!r}: spider {job.spider}, version {job.version}, changed {updated}",
                _settings_line(job),
                self._progress(job),
            ]
        )

    def _progress(self, job: Job) -> str:
        if not job.queue:
            return "no work queue"
        try:
            return (
                f"queue {job.queue!r}: "
                + WorkQueue(self.hub, job.queue, create=False).progress().line()
            )
        except WorkQueueError:
            return f"queue {job.queue!r}: not loaded"


def _settings_line(job: Job) -> str:
    if not job.settings:
        return "settings: none (the project's)"
    return "settings: " + ", ".join(f"{k}={v}" for k, v in sorted(job.settings.items()))
