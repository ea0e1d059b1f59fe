"""The hub: a small database of shared crawl state, here the proxy pool and its leases.

Addressed by ``HUB_URL``:

- ``sqlite:///relative/hub.db`` or ``sqlite:////absolute/hub.db`` (SQLAlchemy's
  convention): one machine, WAL mode, every lease change in one ``BEGIN IMMEDIATE``
  transaction.
- ``postgresql://user@host:5432/db``: many nodes, psycopg 3, acquire with
  ``FOR UPDATE SKIP LOCKED``. ``?options=-csearch_path%3Dmyschema`` picks a schema.

Both backends share the schema and the SQL; times are seconds since the epoch from one
clock (the PostgreSQL server's, or this machine's for SQLite). This module does not
import Scrapy, so that tools, tests and benchmarks can use it directly.
"""

from __future__ import annotations

import os
import random
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SCHEMA_VERSION = 1
END_REASONS = ("rotated", "banned", "released", "expired")
PROXY_SCHEMES = ("http", "https")

_CREDENTIALS_RE = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<userinfo>[^/@\s]*)@")


class HubError(Exception):
    """A hub operation failed."""


class HubUnavailableError(HubError):
    """The hub at HUB_URL cannot be reached or opened."""


class InvalidProxyURLError(HubError, ValueError):
    """A proxy URL is malformed."""


class InvalidHubURLError(HubError, ValueError):
    """HUB_URL is malformed or names an unsupported database."""


def redact_url(url: str) -> str:
    """Return *url* with its password (or a lone user name) replaced by ``***``.

    ``http://user:secret@host:3128`` becomes ``http://user:***@host:3128``; a URL that
    carries only a user name (often an API key) becomes ``http://***@host:3128``.
    Works on malformed URLs too, so that error messages can quote what was given.
    """

    def _sub(match: re.Match[str]) -> str:
        userinfo = match.group("userinfo")
        user, sep, _ = userinfo.partition(":")
        masked = f"{user}:***" if sep else "***"
        return f"{match.group('scheme')}{masked}@"

    return _CREDENTIALS_RE.sub(_sub, url)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret in *text* with ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return redact_url(text)


def normalize_proxy_url(url: str) -> str:
    """Check a proxy URL and return it in canonical form, or raise InvalidProxyURLError.

    Accepted: ``http://[user[:password]@]host:port`` (or https), nothing after the port.
    """
    text = url.strip()
    shown = redact_url(text)
    if not text:
        raise InvalidProxyURLError("empty proxy URL: give http://[user:password@]host:port")
    if "://" not in text:
        raise InvalidProxyURLError(
            f"proxy URL {shown!r} has no scheme: write it as http://[user:password@]host:port"
        )
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        reason = redact_url(str(exc))
        raise InvalidProxyURLError(
            f"proxy URL {shown!r} is malformed ({reason}): "
            "write it as http://[user:password@]host:port"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in PROXY_SCHEMES:
        raise InvalidProxyURLError(
            f"proxy URL {shown!r} has scheme {scheme!r}: use http:// or https://"
        )
    if not parts.hostname:
        raise InvalidProxyURLError(f"proxy URL {shown!r} has no host: write http://host:port")
    if port is None:
        raise InvalidProxyURLError(f"proxy URL {shown!r} has no port: write http://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidProxyURLError(
            f"proxy URL {shown!r} has a path, query or fragment: a proxy URL ends at the port"
        )
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit((scheme, netloc, "", "", ""))


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: host, process id and job/task id (from the environment)."""

    host: str
    pid: int
    task: str = ""

    @classmethod
    def current(cls, environ: dict[str, str] | None = None) -> Holder:
        env = os.environ if environ is None else environ
        return cls(socket.gethostname(), os.getpid(), task_identity(env))

    def __str__(self) -> str:
        base = f"{self.host}/{self.pid}"
        return f"{base}/{self.task}" if self.task else base


def task_identity(env: Any) -> str:
    """Job/task id: HUB_HOLDER, else a SLURM array job_task, else a SLURM job id."""
    if env.get("HUB_HOLDER"):
        return env["HUB_HOLDER"]
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID", "")


@dataclass(frozen=True)
class Lease:
    """A proxy held by this process until renewed or released."""

    lease_id: int
    proxy_id: int
    url: str = field(repr=False)
    label: str
    started: float
    expires: float


@dataclass
class UsageCounts:
    """What a holder did through a proxy since it last reported."""

    requests: int = 0
    bytes: int = 0
    failures: int = 0
    bans: int = 0

    def add(self, other: UsageCounts) -> None:
        self.requests += other.requests
        self.bytes += other.bytes
        self.failures += other.failures
        self.bans += other.bans

    def take(self) -> UsageCounts:
        """Return the counts and reset them to zero."""
        taken = UsageCounts(self.requests, self.bytes, self.failures, self.bans)
        self.requests = self.bytes = self.failures = self.bans = 0
        return taken


@dataclass(frozen=True)
class RestPolicy:
    """How long a released proxy rests before anyone may lease it again."""

    rest_seconds: float = 60.0
    ban_rest_seconds: float = 600.0
    ban_rest_max_seconds: float = 6 * 3600.0
    jitter: float = 0.25

    def rest_for(self, reason: str, consecutive_bans: int, rng: random.Random) -> float:
        if reason == "banned":
            base = self.ban_rest_seconds * 2 ** max(consecutive_bans - 1, 0)
            base = min(base, self.ban_rest_max_seconds)
        else:
            base = self.rest_seconds
        if base <= 0:
            return 0.0
        return base * (1 + rng.uniform(-self.jitter, self.jitter))


@dataclass(frozen=True)
class ProxyRow:
    id: int
    url: str = field(repr=False)
    enabled: bool
    state: str
    holder: str | None
    lease_id: int | None
    lease_expires: float | None
    stretch_uses: int
    total_uses: int
    failures: int
    bans: int
    consecutive_bans: int
    resting_until: float | None
    last_used: float | None

    @property
    def label(self) -> str:
        return redact_url(self.url)

    def effective_state(self, now: float) -> str:
        """The state as a person means it: an expired lease or a rest that ended is free."""
        if not self.enabled:
            return "disabled"
        if self.state == "leased":
            return "expired" if (self.lease_expires or 0) < now else "leased"
        if self.resting_until and self.resting_until > now:
            return self.state
        return "free"


@dataclass(frozen=True)
class UsageRow:
    id: int
    proxy_id: int
    host: str
    pid: int
    task: str
    started: float
    ended: float | None
    requests: int
    bytes: int
    failures: int
    bans: int
    end_reason: str | None


_PROXY_COLUMNS = (
    "id, url, enabled, state, holder, lease_id, lease_expires, stretch_uses, total_uses, "
    "failures, bans, consecutive_bans, resting_until, last_used"
)
_USAGE_COLUMNS = (
    "id, proxy_id, host, pid, task, started, ended, requests, bytes, failures, bans, end_reason"
)

# Numbered migrations; {id} and {real} differ between the dialects.
_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE IF NOT EXISTS hub_proxies (
            id {id},
            url TEXT NOT NULL UNIQUE,
            enabled INTEGER NOT NULL DEFAULT 1,
            state TEXT NOT NULL DEFAULT 'free',
            holder TEXT,
            lease_id BIGINT,
            lease_expires {real},
            stretch_uses INTEGER NOT NULL DEFAULT 0,
            total_uses BIGINT NOT NULL DEFAULT 0,
            failures BIGINT NOT NULL DEFAULT 0,
            bans BIGINT NOT NULL DEFAULT 0,
            consecutive_bans INTEGER NOT NULL DEFAULT 0,
            resting_until {real},
            last_used {real},
            added {real}
        )""",
        """CREATE TABLE IF NOT EXISTS hub_proxy_usage (
            id {id},
            proxy_id BIGINT NOT NULL REFERENCES hub_proxies(id),
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            task TEXT NOT NULL DEFAULT '',
            started {real} NOT NULL,
            ended {real},
            requests BIGINT NOT NULL DEFAULT 0,
            bytes BIGINT NOT NULL DEFAULT 0,
            failures BIGINT NOT NULL DEFAULT 0,
            bans BIGINT NOT NULL DEFAULT 0,
            end_reason TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS hub_proxy_usage_proxy ON hub_proxy_usage (proxy_id, started)",
    ],
}


class _Dialect:
    name = ""
    now = ""
    id_type = ""
    real_type = ""
    lock_suffix = ""

    def sql(self, text: str) -> str:
        return text.replace("NOW()", self.now)


class _SQLiteDialect(_Dialect):
    name = "sqlite"
    now = "hub_now()"
    id_type = "INTEGER PRIMARY KEY"
    real_type = "REAL"


class _PostgresDialect(_Dialect):
    name = "postgresql"
    now = "(EXTRACT(EPOCH FROM clock_timestamp())::float8)"
    id_type = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    real_type = "DOUBLE PRECISION"
    lock_suffix = " FOR UPDATE SKIP LOCKED"

    def sql(self, text: str) -> str:
        return super().sql(text).replace("?", "%s")


def _sqlite_path(url: str) -> Path:
    path = url[len("sqlite:///") :]
    if not path:
        raise InvalidHubURLError(
            f"HUB_URL {url!r} names no file: use sqlite:///relative/hub.db or "
            "sqlite:////absolute/hub.db"
        )
    return Path(path)


class Hub:
    """Connection to the hub database; thread-safe (one lock around the connection)."""

    def __init__(self, conn: Any, dialect: _Dialect, url: str) -> None:
        self._conn = conn
        self._dialect = dialect
        self._lock = threading.Lock()
        self._rng = random.Random()
        self.url = url
        self.label = redact_url(url)

    # --- opening ------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, connect_timeout: float = 10.0, create: bool = True) -> Hub:
        """Connect to the hub at *url* and create or upgrade its schema."""
        if not url:
            raise InvalidHubURLError(
                "HUB_URL is empty: set it to sqlite:///hub.db or postgresql://..."
            )
        if url.startswith("sqlite:///"):
            hub = cls._open_sqlite(url, connect_timeout)
        elif url.startswith(("postgresql://", "postgres://")):
            hub = cls._open_postgres(url, connect_timeout)
        else:
            raise InvalidHubURLError(
                f"HUB_URL {redact_url(url)!r} is not supported: use sqlite:///path/hub.db "
                "or postgresql://user@host:port/database"
            )
        if create:
            try:
                hub.ensure_schema()
            except Exception:
                hub.close()
                raise
        return hub

    @classmethod
    def _open_sqlite(cls, url: str, timeout: float) -> Hub:
        path = _sqlite_path(url)
        if not path.parent.is_dir():
            raise HubUnavailableError(
                f"cannot open the hub {url!r}: directory {str(path.parent.resolve())!r} "
                "does not exist; create it or fix HUB_URL"
            )
        try:
            conn = sqlite3.connect(
                path, timeout=max(timeout, 30.0), isolation_level=None, check_same_thread=False
            )
            conn.create_function("hub_now", 0, time.time)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            raise HubUnavailableError(
                f"cannot open the hub {url!r} ({exc}): check the path and its permissions"
            ) from None
        return cls(conn, _SQLiteDialect(), url)

    @classmethod
    def _open_postgres(cls, url: str, timeout: float) -> Hub:
        try:
            import psycopg
        except ImportError:
            raise HubUnavailableError(
                "HUB_URL names PostgreSQL but psycopg is not installed: "
                "pip install 'psycopg[binary]'"
            ) from None
        parts = urlsplit(url)
        secrets = [parts.password or ""]
        try:
            conn = psycopg.connect(url, autocommit=True, connect_timeout=max(int(timeout), 1))
        except psycopg.Error as exc:
            reason = redact_text(str(exc).strip().replace("\n", " "), secrets)
            raise HubUnavailableError(
                f"cannot reach the hub at {redact_url(url)} within {timeout:g} s: {reason}. "
                "Check HUB_URL and that the server is up."
            ) from None
        return cls(conn, _PostgresDialect(), url)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def backend(self) -> str:
        return self._dialect.name

    # --- plumbing -----------------------------------------------------------------
    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """One write transaction: BEGIN IMMEDIATE on SQLite, a plain one on PostgreSQL."""
        with self._lock:
            if self._dialect.name == "sqlite":
                cur = self._conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
                try:
                    yield cur
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
            else:
                with self._conn.transaction(), self._conn.cursor() as cur:
                    yield cur

    def _exec(self, cur: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
        cur.execute(self._dialect.sql(sql), params)
        return cur

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._transaction() as cur:
            return list(self._exec(cur, sql, params).fetchall())

    def ensure_schema(self) -> int:
        """Create or upgrade the tables; safe to call from many processes at once."""
        d = self._dialect
        with self._transaction() as cur:
            if d.name == "postgresql":
                # Serialise concurrent creators (CREATE ... IF NOT EXISTS races otherwise).
                cur.execute("SELECT pg_advisory_xact_lock(7302519001)")
            self._exec(cur, "CREATE TABLE IF NOT EXISTS hub_schema (version INTEGER NOT NULL)")
            row = self._exec(cur, "SELECT MAX(version) FROM hub_schema").fetchone()
            current = row[0] or 0
            for version in sorted(v for v in _MIGRATIONS if v > current):
                for statement in _MIGRATIONS[version]:
                    self._exec(cur, statement.format(id=d.id_type, real=d.real_type))
                self._exec(cur, "INSERT INTO hub_schema (version) VALUES (?)", (version,))
        return max(current, SCHEMA_VERSION)

    def schema_version(self) -> int:
        return self._query("SELECT MAX(version) FROM hub_schema")[0][0] or 0

    def now(self) -> float:
        """The hub's clock."""
        return float(self._query("SELECT NOW()")[0][0])

    # --- managing the pool --------------------------------------------------------
    def add_proxies(self, urls: Iterable[str]) -> tuple[int, int]:
        """Add proxies (validated first, all or none); return (added, already there)."""
        normalized = [normalize_proxy_url(url) for url in urls]
        added = 0
        with self._transaction() as cur:
            for url in dict.fromkeys(normalized):
                found = self._exec(cur, "SELECT id FROM hub_proxies WHERE url = ?", (url,))
                if found.fetchone():
                    continue
                self._exec(cur, "INSERT INTO hub_proxies (url, added) VALUES (?, NOW())", (url,))
                added += 1
        return added, len(normalized) - added

    def find_proxy(self, ref: str) -> ProxyRow:
        """A proxy by id, by URL, or by the redacted URL that ``list`` shows."""
        rows = self.proxies()
        ref = ref.strip()
        if ref.isdigit():
            matches = [row for row in rows if row.id == int(ref)]
        else:
            try:
                url = normalize_proxy_url(ref)
            except InvalidProxyURLError:
                url = ref
            matches = [row for row in rows if url in (row.url, row.label)]
        if len(matches) != 1:
            what = "no proxy" if not matches else f"{len(matches)} proxies"
            raise HubError(
                f"{what} in the hub match {redact_url(ref)!r}: give an id or a URL "
                "as `scrapy proxies list` shows it"
            )
        return matches[0]

    def set_enabled(self, proxy_id: int, enabled: bool) -> None:
        with self._transaction() as cur:
            self._exec(
                cur, "UPDATE hub_proxies SET enabled = ? WHERE id = ?", (int(enabled), proxy_id)
            )

    def end_rest(self, proxy_id: int | None = None) -> None:
        """Let resting or banned proxies (all, or one) be leased again at once."""
        sql = "UPDATE hub_proxies SET resting_until = NULL"
        params: tuple[Any, ...] = ()
        if proxy_id is not None:
            sql, params = sql + " WHERE id = ?", (proxy_id,)
        with self._transaction() as cur:
            self._exec(cur, sql, params)

    def proxies(self) -> list[ProxyRow]:
        rows = self._query(f"SELECT {_PROXY_COLUMNS} FROM hub_proxies ORDER BY id")
        return [_proxy_row(row) for row in rows]

    def enabled_count(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM hub_proxies WHERE enabled = 1")[0][0])

    def usage(self, proxy_id: int | None = None) -> list[UsageRow]:
        sql = f"SELECT {_USAGE_COLUMNS} FROM hub_proxy_usage"
        params: tuple[Any, ...] = ()
        if proxy_id is not None:
            sql, params = sql + " WHERE proxy_id = ?", (proxy_id,)
        rows = self._query(sql + " ORDER BY id", params)
        return [UsageRow(*row) for row in rows]

    def usage_stats(self) -> list[dict[str, Any]]:
        """Per proxy, over its usage rows: leases, requests, bytes, failures, bans."""
        rows = self._query(
            "SELECT p.id, p.url, p.enabled, COUNT(u.id), COALESCE(SUM(u.requests), 0), "
            "COALESCE(SUM(u.bytes), 0), COALESCE(SUM(u.failures), 0), "
            "COALESCE(SUM(u.bans), 0) "
            "FROM hub_proxies p LEFT JOIN hub_proxy_usage u ON u.proxy_id = p.id "
            "GROUP BY p.id, p.url, p.enabled ORDER BY p.id"
        )
        keys = ("id", "url", "enabled", "leases", "requests", "bytes", "failures", "bans")
        stats = []
        for row in rows:
            item = dict(
                zip(
                    keys,
                    (int(value) if i != 1 else value for i, value in enumerate(row)),
                    strict=True,
                )
            )
            item["enabled"] = bool(item["enabled"])
            item["label"] = redact_url(item.pop("url"))
            item["ban_rate"] = item["bans"] / item["requests"] if item["requests"] else 0.0
            stats.append(item)
        return stats

    # --- leases -------------------------------------------------------------------
    def acquire(self, holder: Holder, ttl: float) -> Lease | None:
        """Lease the least recently used free proxy for *ttl* seconds, or return None."""
        with self._transaction() as cur:
            row = self._exec(
                cur,
                "SELECT id, url, state, lease_id, lease_expires FROM hub_proxies "
                "WHERE enabled = 1 AND (state <> 'leased' OR lease_expires < NOW()) "
                "AND COALESCE(resting_until, 0) <= NOW() "
                "ORDER BY COALESCE(last_used, 0), id LIMIT 1" + self._dialect.lock_suffix,
            ).fetchone()
            if row is None:
                return None
            proxy_id, url, state, old_lease, old_expires = row
            if state == "leased" and old_lease is not None:
                self._exec(
                    cur,
                    "UPDATE hub_proxy_usage SET ended = ?, end_reason = 'expired' "
                    "WHERE id = ? AND ended IS NULL",
                    (old_expires, old_lease),
                )
            lease_id, started = self._exec(
                cur,
                "INSERT INTO hub_proxy_usage (proxy_id, host, pid, task, started) "
                "VALUES (?, ?, ?, ?, NOW()) RETURNING id, started",
                (proxy_id, holder.host, holder.pid, holder.task),
            ).fetchone()
            expires = started + ttl
            self._exec(
                cur,
                "UPDATE hub_proxies SET state = 'leased', holder = ?, lease_id = ?, "
                "lease_expires = ?, stretch_uses = 0, last_used = ? WHERE id = ?",
                (str(holder), lease_id, expires, started, proxy_id),
            )
        return Lease(lease_id, proxy_id, url, redact_url(url), started, expires)

    def renew(self, lease: Lease, ttl: float, counts: UsageCounts | None = None) -> bool:
        """Extend a lease by *ttl* from now and record usage; False if the lease was lost."""
        counts = counts or UsageCounts()
        with self._transaction() as cur:
            self._add_usage(cur, lease, counts)
            cur = self._exec(
                cur,
                "UPDATE hub_proxies SET lease_expires = NOW() + ?, "
                "stretch_uses = stretch_uses + ?, total_uses = total_uses + ?, "
                "failures = failures + ?, bans = bans + ? "
                "WHERE id = ? AND lease_id = ? AND state = 'leased'",
                (ttl, counts.requests, counts.requests, counts.failures, counts.bans)
                + (lease.proxy_id, lease.lease_id),
            )
            return cur.rowcount == 1

    def release(
        self,
        lease: Lease,
        reason: str,
        counts: UsageCounts | None = None,
        policy: RestPolicy | None = None,
    ) -> bool:
        """End a lease: close its usage row and let the proxy rest; False if it was lost."""
        if reason not in END_REASONS:
            raise ValueError(f"release reason {reason!r} is not one of {END_REASONS}")
        counts, policy = counts or UsageCounts(), policy or RestPolicy()
        with self._transaction() as cur:
            self._add_usage(cur, lease, counts)
            lock = " FOR UPDATE" if self._dialect.name == "postgresql" else ""
            row = self._exec(
                cur,
                "SELECT consecutive_bans FROM hub_proxies WHERE id = ? AND lease_id = ?" + lock,
                (lease.proxy_id, lease.lease_id),
            ).fetchone()
            if row is None:
                return False
            streak = row[0] + 1 if reason == "banned" else 0
            rested = counts.requests > 0 or reason == "banned" or self._used(cur, lease)
            rest = policy.rest_for(reason, streak, self._rng) if rested else 0.0
            self._exec(
                cur,
                "UPDATE hub_proxy_usage SET ended = NOW(), end_reason = ? "
                "WHERE id = ? AND ended IS NULL",
                (reason, lease.lease_id),
            )
            state = "banned" if reason == "banned" else ("resting" if rest > 0 else "free")
            self._exec(
                cur,
                "UPDATE hub_proxies SET state = ?, holder = NULL, lease_id = NULL, "
                "lease_expires = NULL, resting_until = NOW() + ?, consecutive_bans = ?, "
                "total_uses = total_uses + ?, failures = failures + ?, bans = bans + ?, "
                "stretch_uses = stretch_uses + ?, last_used = NOW() WHERE id = ?",
                (state, rest, streak, counts.requests, counts.failures, counts.bans)
                + (counts.requests, lease.proxy_id),
            )
        return True

    def _used(self, cur: Any, lease: Lease) -> bool:
        row = self._exec(
            cur, "SELECT requests FROM hub_proxy_usage WHERE id = ?", (lease.lease_id,)
        ).fetchone()
        return bool(row and row[0])

    def _add_usage(self, cur: Any, lease: Lease, counts: UsageCounts) -> None:
        if not (counts.requests or counts.bytes or counts.failures or counts.bans):
            return
        self._exec(
            cur,
            "UPDATE hub_proxy_usage SET requests = requests + ?, bytes = bytes + ?, "
            "failures = failures + ?, bans = bans + ? WHERE id = ?",
            (counts.requests, counts.bytes, counts.failures, counts.bans, lease.lease_id),
        )


def _proxy_row(row: tuple[Any, ...]) -> ProxyRow:
    values = list(row)
    values[2] = bool(values[2])
    return ProxyRow(*values)


def churn(url: str, seconds: float, hold_seconds: float = 0.0, ttl: float = 60.0) -> int:
    """Lease, hold, release in a loop for *seconds*; return the leases done.

    For contention tests and benchmarks: run it in several processes at once.
    """
    rng = random.Random()
    policy = RestPolicy(rest_seconds=0.0, ban_rest_seconds=0.0, jitter=0.0)
    done = 0
    with Hub.open(url) as hub:
        holder = Holder.current()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            lease = hub.acquire(holder, ttl)
            if lease is None:
                time.sleep(rng.uniform(0.0005, 0.005))
                continue
            if hold_seconds:
                time.sleep(rng.uniform(0, hold_seconds))
            hub.release(lease, "rotated", UsageCounts(requests=1), policy)
            done += 1
    return done
