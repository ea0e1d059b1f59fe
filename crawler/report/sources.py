"""What a report reads: catalogs, action logs and the proxy hub, all read-only.

Two layouts are recognised: a crawl's data directory (its catalog and action log)
and a Slurm run's ``DATA/`` (each task's shipped catalog and action log, and the
merged catalog once there is one); :class:`~crawler.storage.datadir.DataDir` names
the files. Catalogs are opened read-only (:class:`~crawler.storage.catalog.Catalog`),
so a report can be made while a crawl writes.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from crawler.storage.catalog import Catalog, readonly_uri
from crawler.storage.datadir import DataDir
from crawler.storage.errors import CatalogError
from crawler.storage.items import item_table_names, quote


class ReportError(Exception):
    """The report cannot be made (missing directory, unreadable catalog or hub)."""


@dataclass
class Task:
    """One crawl's catalog and action log (either may be missing)."""

    name: str
    catalog: Path | None
    log: Path | None


@dataclass
class Layout:
    """The files of a data directory that a report reads."""

    root: Path
    main_catalog: Path | None
    tasks: list[Task]

    @property
    def empty(self) -> bool:
        return self.main_catalog is None and not any(t.catalog or t.log for t in self.tasks)

    @property
    def catalogs(self) -> list[Path]:
        """The catalogs to count: the merged one when there is one, else each task's."""
        if self.main_catalog is not None:
            return [self.main_catalog]
        return [t.catalog for t in self.tasks if t.catalog is not None]

    @property
    def logs(self) -> list[tuple[str, Path]]:
        return [(t.name, t.log) for t in self.tasks if t.log is not None]


def find_layout(root: Path) -> Layout:
    """The catalogs and logs under *root*; raises ReportError when it is not a directory."""
    if not root.is_dir():
        raise ReportError(
            f"{root}: no such data directory (give it with -s DATA_DIR=... or run a crawl first)"
        )
    datadir = DataDir(root)
    main = _file(datadir.catalog_path)
    tasks: list[Task] = []
    if datadir.action_log_path.is_file():
        tasks.append(Task(root.name or str(root), main, datadir.action_log_path))
    for name in datadir.shipped_names():
        tasks.append(
            Task(
                name,
                _file(datadir.shipped_catalog(name)),
                _file(datadir.shipped_action_log(name)),
            )
        )
    return Layout(root, main, tasks)


def _file(path: Path) -> Path | None:
    return path if path.is_file() else None


@dataclass
class ItemTable:
    name: str
    rows: int
    pages: int  # distinct _key


@dataclass
class CatalogSummary:
    """Counts over one or more catalogs, read with plain SQL."""

    rows: int = 0
    bytes: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    content_types: Counter[str] = field(default_factory=Counter)
    items: dict[str, ItemTable] = field(default_factory=dict)
    oldest: str | None = None
    newest: str | None = None

    def add(self, other: CatalogSummary) -> None:
        self.rows += other.rows
        self.bytes += other.bytes
        self.statuses.update(other.statuses)
        self.content_types.update(other.content_types)
        for name, table in other.items.items():
            mine = self.items.setdefault(name, ItemTable(name, 0, 0))
            mine.rows += table.rows
            mine.pages += table.pages
        for when in (other.oldest, other.newest):
            if when:
                self.oldest = min(self.oldest or when, when)
                self.newest = max(self.newest or when, when)


def open_readonly(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(readonly_uri(path), uri=True, timeout=30)
    conn.execute("PRAGMA query_only = 1")
    return conn


def read_catalog(path: Path) -> CatalogSummary:
    """Rows, bytes, statuses, content types and item tables of one catalog."""
    summary = CatalogSummary()
    try:
        with Catalog(path, readonly=True) as catalog:
            totals = catalog.summary()
            summary.rows, summary.bytes = totals["rows"], totals["bytes"]
            for status, count in totals["by_status"].items():
                summary.statuses[int(status or 0)] += count
            for ctype, count in catalog.count_by("content_type"):
                summary.content_types[normalise_type(ctype)] += count
            _, _, summary.oldest, summary.newest = catalog.overview()
            summary.items = read_item_tables(catalog.conn)
    except CatalogError as exc:  # names the file
        raise ReportError(f"cannot read the catalog {exc}") from exc
    except sqlite3.Error as exc:
        raise ReportError(f"{path}: cannot read the catalog: {exc}") from exc
    return summary


def normalise_type(value: str | None) -> str:
    return (value or "(none)").split(";", 1)[0].strip().lower() or "(none)"


def read_item_tables(conn: sqlite3.Connection) -> dict[str, ItemTable]:
    """Every item table (crawler/storage/items.py), with its rows and pages."""
    tables = {}
    for name in item_table_names(conn):
        rows, pages = conn.execute(
            f"SELECT count(*), count(DISTINCT _key) FROM {quote(name)}"
        ).fetchone()
        tables[name] = ItemTable(name, rows, pages)
    return tables


def stored_keys(paths: list[Path], keys: set[str], chunk: int = 500) -> set[str]:
    """Which of *keys* have a row in any of the catalogs *paths* (read-only)."""
    found: set[str] = set()
    wanted = sorted(keys)
    for path in paths:
        try:
            conn = open_readonly(path)
        except sqlite3.Error as exc:
            raise ReportError(f"{path}: cannot read the catalog: {exc}") from exc
        try:
            for i in range(0, len(wanted), chunk):
                part = wanted[i : i + chunk]
                marks = ", ".join("?" * len(part))
                sql = f"SELECT key FROM artifacts WHERE key IN ({marks})"
                found.update(row[0] for row in conn.execute(sql, part))
        except sqlite3.Error as exc:
            raise ReportError(f"{path}: cannot read the catalog: {exc}") from exc
        finally:
            conn.close()
    return found


def read_catalogs(paths: list[Path]) -> CatalogSummary:
    total = CatalogSummary()
    for path in paths:
        total.add(read_catalog(path))
    return total


# -- the proxy hub ---------------------------------------------------------------------------

_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<userinfo>[^@/\s]+)@", re.I)


def redact(url: str) -> str:
    """``http://user:secret@host`` as ``http://user:***@host`` (a lone user as ``***``)."""

    def sub(match: re.Match[str]) -> str:
        user, sep, _ = match.group("userinfo").partition(":")
        return f"{match.group('scheme')}{user + ':***' if sep else '***'}@"

    return _CREDENTIALS.sub(sub, url)


@dataclass
class HubProxy:
    id: int
    url: str  # redacted
    enabled: bool
    state: str
    total_uses: int
    failures: int
    bans: int
    resting_until: float | None


@dataclass
class HubLease:
    proxy_id: int
    started: float
    ended: float | None
    requests: int
    bans: int
    end_reason: str | None


@dataclass
class HubSummary:
    url: str  # redacted
    now: float
    proxies: list[HubProxy]
    leases: list[HubLease]


def read_hub(hub_url: str, now: float) -> HubSummary:
    """The hub's proxies and their leases, through a plain database connection.

    Kept in this one function so that it can be switched to the hub's own API.
    """
    proxy_sql = (
        "SELECT id, url, enabled, state, total_uses, failures, bans, resting_until "
        "FROM hub_proxies ORDER BY id"
    )
    lease_sql = (
        "SELECT proxy_id, started, ended, requests, bans, end_reason "
        "FROM hub_proxy_usage ORDER BY started"
    )
    try:
        if hub_url.startswith("sqlite:///"):
            conn = open_readonly(Path(hub_url[len("sqlite:///") :]))
        elif hub_url.startswith(("postgresql://", "postgres://")):
            import psycopg

            conn = psycopg.connect(hub_url, connect_timeout=10)
        else:
            raise ReportError(
                f"HUB_URL {redact(hub_url)!r} is not supported: use sqlite:///path/hub.db "
                "or postgresql://..."
            )
        try:
            if not has_table(conn, "hub_proxies", hub_url.startswith("sqlite:///")):
                return HubSummary(redact(hub_url), now, [], [])  # a hub of work queues only
            proxies = [
                HubProxy(r[0], redact(r[1]), bool(r[2]), r[3], r[4], r[5], r[6], r[7])
                for r in conn.execute(proxy_sql).fetchall()
            ]
            leases = [HubLease(*r) for r in conn.execute(lease_sql).fetchall()]
        finally:
            conn.close()
    except ReportError:
        raise
    except Exception as exc:  # sqlite3.Error, psycopg.Error: both name the hub
        raise ReportError(f"hub {redact(hub_url)}: cannot read its proxies: {exc}") from exc
    return HubSummary(redact(hub_url), now, proxies, leases)


def table_sql(sqlite: bool, mark: str = "?") -> str:
    """A count of the tables named by the one parameter (*mark* is its placeholder)."""
    if sqlite:
        return f"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = {mark}"
    return (
        "SELECT count(*) FROM information_schema.tables "
        f"WHERE table_schema = current_schema() AND table_name = {mark}"
    )


def has_table(conn, name: str, sqlite: bool) -> bool:
    """Whether a plain connection (sqlite3 or psycopg) sees table *name*."""
    return bool(conn.execute(table_sql(sqlite, "?" if sqlite else "%s"), (name,)).fetchone()[0])


@dataclass
class QueueSummary:
    """How much of one work queue is left (``scrapy queue stats``)."""

    name: str
    total: int
    done: int
    pending: int
    leased: int
    expired: int
    failed: int
    rate: float  # URLs done per second over the window
    eta: float | None  # seconds; None when nothing was done in the window


def read_queues(hub_url: str, window: float = 600.0) -> list[QueueSummary]:
    """Every work queue of the hub, through its own API; none when it holds no queues."""
    from crawler.hub import Hub, WorkQueue

    try:
        with Hub.open(hub_url) as hub:
            if not hub.query(table_sql(hub.backend == "sqlite"), ("hub_work_queues",))[0][0]:
                return []
            names = [row[0] for row in hub.query("SELECT name FROM hub_work_queues ORDER BY name")]
            queues = []
            for name in names:
                stats = WorkQueue(hub, name, create=False).stats(window)
                p = stats.progress
                queues.append(
                    QueueSummary(
                        name,
                        p.total,
                        p.done,
                        p.pending,
                        p.leased,
                        p.expired,
                        stats.failed,
                        stats.rate,
                        stats.eta,
                    )  # fmt: skip
                )
            return queues
    except Exception as exc:  # HubError, sqlite3.Error, psycopg.Error: all name the hub
        raise ReportError(f"hub {redact(hub_url)}: cannot read its work queues: {exc}") from exc


@dataclass
class HubHost:
    """One host's budget in the hub (``hub_hosts``): its interval and concurrency, the
    Crawl-delay it keeps to, and the back-off left (seconds from the hub's now)."""

    key: str
    interval: float
    concurrency: int
    crawl_delay: float | None
    backoff_left: float
    backoff_reason: str | None


def read_host_budgets(hub_url: str) -> list[HubHost]:
    """The hub's host budgets, through its own API; none when it keeps none."""
    from crawler.hub import Hub

    try:
        with Hub.open(hub_url) as hub:
            if not hub.query(table_sql(hub.backend == "sqlite"), ("hub_hosts",))[0][0]:
                return []
            now = hub.now()
            rows = hub.query(
                "SELECT key, interval_s, concurrency, crawl_delay, backoff_until, "
                "backoff_reason FROM hub_hosts ORDER BY key"
            )
    except Exception as exc:  # HubError, sqlite3.Error, psycopg.Error: all name the hub
        raise ReportError(f"hub {redact(hub_url)}: cannot read its host budgets: {exc}") from exc
    return [
        HubHost(
            str(key),
            float(interval or 0),
            int(concurrency or 1),
            None if delay is None else float(delay),
            max(float(until or 0) - now, 0.0),
            reason,
        )  # fmt: skip
        for key, interval, concurrency, delay, until, reason in rows
    ]
