"""The hub's database, its proxy table and leases, on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from crawler.hub import (
    SCHEMA_VERSION,
    AdvisoryLock,
    Holder,
    Hub,
    HubUnavailableError,
    InvalidHubURLError,
    InvalidProxyURLError,
    ProxyPool,
    RestPolicy,
    UsageCounts,
    normalize_proxy_url,
    redact_url,
)
from tests.hubs import hub_url, pg_schema_url  # noqa: F401 - hub_url: a fixture
from tests.servers import need_module

ROOT = Path(__file__).resolve().parent.parent
HOLDER = Holder("testhost", 1, "job_1")
NO_REST = RestPolicy(rest_seconds=0, ban_rest_seconds=0, jitter=0)


@pytest.fixture
def hub(hub_url):  # noqa: F811
    with Hub.open(hub_url) as opened:
        yield opened


@pytest.fixture
def pool(hub):
    return ProxyPool(hub)


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_python(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )


NO_SCRAPY = """
    import importlib.abc, sys

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] in ("scrapy", "twisted"):
                raise ImportError(f"{name} is blocked")

    sys.meta_path.insert(0, Blocked())
    import crawler.hub, crawler.admin, crawler.hub.leases
    print("imported")
"""


def test_the_hub_needs_no_scrapy():
    """Tools, tests and benchmarks use the hub without Scrapy or Twisted installed."""
    done = run_python(NO_SCRAPY)
    assert done.stdout.strip() == "imported", done.stderr


# --- URLs --------------------------------------------------------------------------
def test_redact_url():
    assert redact_url("http://user:secret@host:3128") == "http://user:***@host:3128"
    assert redact_url("http://apikey@host:3128") == "http://***@host:3128"
    assert redact_url("http://host:3128") == "http://host:3128"
    assert redact_url("see postgresql://u:pw@db/x now") == "see postgresql://u:***@db/x now"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("HTTP://User:pw@Example.COM:3128/", "http://User:pw@example.com:3128"),
        ("https://10.0.0.1:8443", "https://10.0.0.1:8443"),
        ("  http://h:1  ", "http://h:1"),
    ],
)
def test_normalize_proxy_url(url, expected):
    assert normalize_proxy_url(url) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:3128", "has no scheme"),
        ("socks5://u:hunter2@h:1080", "use http:// or https://"),
        ("http://u:hunter2@h", "has no port"),
        ("http://u:hunter2@h:99999", "malformed"),
        ("http://u:hunter2@h:1/path", "ends at the port"),
        ("http://:1", "has no host"),
        ("", "empty proxy URL"),
    ],
)
def test_malformed_proxy_url_is_refused_clearly(url, says):
    with pytest.raises(InvalidProxyURLError) as info:
        normalize_proxy_url(url)
    message = str(info.value)
    assert says in message
    assert "hunter2" not in message


def test_holder_identity_from_environment():
    assert Holder.current({"HUB_HOLDER": "me", "SLURM_JOB_ID": "5"}).task == "me"
    env = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "9"}
    assert Holder.current(env).task == "7_3"
    assert Holder.current({"SLURM_JOB_ID": "9"}).task == "9"
    holder = Holder.current({})
    assert holder.pid == os.getpid() and holder.task == ""


def test_rest_policy_grows_exponentially_and_is_capped():
    import random

    policy = RestPolicy(rest_seconds=10, ban_rest_seconds=100, ban_rest_max_seconds=350, jitter=0)
    rng = random.Random(1)
    assert [policy.rest_for("banned", n, rng) for n in (1, 2, 3, 4)] == [100, 200, 350, 350]
    assert policy.rest_for("rotated", 0, rng) == 10
    jittered = RestPolicy(rest_seconds=100, jitter=0.25)
    rests = {jittered.rest_for("rotated", 0, rng) for _ in range(50)}
    assert all(75 <= r <= 125 for r in rests) and len(rests) > 1


# --- schema and pool ------------------------------------------------------------------
def test_schema_creation_is_idempotent_and_versioned(hub_url):  # noqa: F811
    for _ in range(3):
        with Hub.open(hub_url) as hub:
            assert ProxyPool(hub).schema_version() == SCHEMA_VERSION
    with Hub.open(hub_url) as hub:
        assert hub.query("SELECT COUNT(*) FROM hub_schema")[0][0] == SCHEMA_VERSION


def _indexes(hub: Hub) -> set[str]:
    if hub.backend == "sqlite":
        rows = hub.query("SELECT name FROM sqlite_master WHERE type = 'index'")
    else:
        rows = hub.query("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
    return {row[0] for row in rows}


def _functions(hub: Hub) -> set[str]:
    rows = hub.query(
        "SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace"
    )
    return {row[0] for row in rows}


def test_a_version_1_hub_is_upgraded(hub_url):  # noqa: F811
    with Hub.open(hub_url) as hub:
        ProxyPool(hub)
        assert "hub_proxies_lru" in _indexes(hub)
        # Back to version 1: without what versions 2 to 6 added.
        hub.execute("DROP TABLE hub_proxy_waiters")
        for column in ("lease_crawl", "rest_crawl", "rest_pid"):
            hub.execute(f"ALTER TABLE hub_proxies DROP COLUMN {column}")
        hub.execute("DROP INDEX hub_proxies_lru")
        hub.execute("DROP INDEX hub_proxy_usage_started")
        hub.execute("ALTER TABLE hub_proxy_usage DROP COLUMN waited")
        if hub.backend == "postgresql":
            for function in ("hub_rotate", "hub_take", "hub_release"):
                hub.execute(f"DROP FUNCTION {function}")
            assert not _functions(hub)
        hub.execute("DELETE FROM hub_schema WHERE version > 1")
    with Hub.open(hub_url) as hub:
        pool = ProxyPool(hub)
        assert pool.schema_version() == SCHEMA_VERSION == 6
        assert {"hub_proxies_lru", "hub_proxy_usage_started"} <= _indexes(hub)
        assert hub.has_table("hub_proxy_waiters")
        if hub.backend == "postgresql":
            assert _functions(hub) == {"hub_rotate", "hub_take", "hub_release"}
        pool.add(["http://127.0.0.1:3128"])
        lease = pool.acquire(HOLDER, 60, waited=2.5)
        assert [row.waited for row in pool.usage()] == [2.5] and lease is not None


def test_add_list_disable_enable(pool):
    assert pool.add(["http://u:pw@127.0.0.1:3128", "http://127.0.0.1:3129/"]) == (2, 0)
    assert pool.add(["http://127.0.0.1:3129"]) == (0, 1)
    with pytest.raises(InvalidProxyURLError):
        pool.add(["http://127.0.0.1:3130", "nonsense"])
    assert len(pool.proxies()) == 2, "a batch with a bad URL adds nothing"
    first = pool.find("http://u:***@127.0.0.1:3128")
    assert first.url == "http://u:pw@127.0.0.1:3128" and "pw" not in repr(first)
    pool.set_enabled(first.id, False)
    assert pool.enabled_count() == 1
    lease = pool.acquire(HOLDER, 60)
    assert lease is not None and lease.proxy_id != first.id
    assert pool.acquire(HOLDER, 60) is None, "the disabled proxy is never leased"
    pool.set_enabled(first.id, True)
    assert pool.acquire(HOLDER, 60).proxy_id == first.id


# --- leases ----------------------------------------------------------------------------
def test_lease_is_exclusive_and_release_closes_usage(pool):
    pool.add(["http://u:pw@127.0.0.1:1", "http://127.0.0.1:2"])
    a, b = pool.acquire(HOLDER, 60), pool.acquire(HOLDER, 60)
    assert {a.proxy_id, b.proxy_id} == {1, 2}
    assert a.label == "http://u:***@127.0.0.1:1" or b.label == "http://u:***@127.0.0.1:1"
    assert pool.acquire(HOLDER, 60) is None
    assert pool.renew(a, 60, UsageCounts(requests=3, bytes=300))
    assert pool.release(a, "rotated", UsageCounts(requests=1, bytes=10), NO_REST)
    row = next(r for r in pool.usage() if r.id == a.lease_id)
    assert (row.requests, row.bytes, row.end_reason) == (4, 310, "rotated")
    assert row.ended >= row.started and (row.host, row.pid, row.task) == ("testhost", 1, "job_1")
    proxy = next(p for p in pool.proxies() if p.id == a.proxy_id)
    assert (proxy.state, proxy.total_uses, proxy.holder) == ("free", 4, None)
    again = pool.acquire(HOLDER, 60)
    assert again.proxy_id == a.proxy_id and again.lease_id != a.lease_id
    assert not pool.release(a, "released"), "a lease ends once"


def test_rest_after_rotation_and_exponential_ban_rest(pool, hub):
    pool.add(["http://127.0.0.1:1"])
    policy = RestPolicy(rest_seconds=50, ban_rest_seconds=100, ban_rest_max_seconds=1000, jitter=0)
    lease = pool.acquire(HOLDER, 60)
    pool.release(lease, "rotated", UsageCounts(requests=5), policy)
    assert pool.acquire(HOLDER, 60) is None, "a rotated proxy rests"
    rests = []
    for _ in range(3):
        pool.end_rest()
        lease = pool.acquire(HOLDER, 60)
        pool.release(lease, "banned", UsageCounts(requests=1, bans=1, failures=1), policy)
        proxy = pool.proxies()[0]
        assert proxy.state == "banned" and proxy.effective_state(hub.now()) == "banned"
        rests.append(proxy.resting_until - proxy.last_used)
    assert [round(r) for r in rests] == [100, 200, 400]
    pool.end_rest()
    pool.release(pool.acquire(HOLDER, 60), "rotated", UsageCounts(requests=1), policy)
    assert pool.proxies()[0].consecutive_bans == 0 and pool.proxies()[0].bans == 3


def test_rotation_releases_and_leases_the_next_proxy_never_the_same(pool, hub):
    pool.add(["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"])
    policy = RestPolicy(rest_seconds=50, ban_rest_seconds=100, jitter=0)
    a, b = pool.acquire(HOLDER, 60), pool.acquire(HOLDER, 60)
    released, c = pool.rotate(a, "banned", UsageCounts(3, 30, 1, 1), policy, HOLDER, 60, 2.5)
    assert released and c is not None and c.proxy_id not in (a.proxy_id, b.proxy_id)
    rows = {row.id: row for row in pool.usage()}
    old, new = rows[a.lease_id], rows[c.lease_id]
    assert (old.requests, old.bytes, old.bans, old.end_reason) == (3, 30, 1, "banned")
    assert new.ended is None and new.waited == 2.5 and old.ended <= new.started
    banned = next(p for p in pool.proxies() if p.id == a.proxy_id)
    assert banned.state == "banned" and round(banned.resting_until - banned.last_used) == 100
    # Nothing free (a's proxy rests): the release is done all the same.
    assert pool.rotate(c, "rotated", UsageCounts(1), policy, HOLDER, 60) == (True, None)
    assert next(r for r in pool.usage() if r.id == c.lease_id).end_reason == "rotated"
    # A lease already ended: nothing released, and the proxy it named is not taken.
    pool.end_rest()
    released, d = pool.rotate(a, "rotated", UsageCounts(), policy, HOLDER, 60)
    assert not released and d is not None and d.proxy_id != a.proxy_id
    assert next(p for p in pool.proxies() if p.id == a.proxy_id).state == "banned"


def test_expired_lease_is_taken_over_and_its_holder_told(pool):
    pool.add(["http://127.0.0.1:1"])
    stale = pool.acquire(HOLDER, -1)  # already expired: as if its holder had died
    fresh = pool.acquire(Holder("other", 2), 60)
    assert fresh is not None and fresh.proxy_id == stale.proxy_id
    assert not pool.renew(stale, 60), "the old holder learns it lost the lease"
    assert not pool.release(stale, "released")
    old = next(r for r in pool.usage() if r.id == stale.lease_id)
    assert old.end_reason == "expired" and old.ended <= fresh.started
    assert pool.renew(fresh, 60)


def test_a_rotation_waits_for_its_own_lease_before_it_holds_another_proxy():
    """Two rotations deadlocked when each held the row of the next proxy it picked while
    waiting for the row of the lease it releases. A rotation must wait, if it waits, before
    it holds any other row: here its lease's row is held elsewhere, and every other proxy
    must stay free to lock until that lets go."""
    url, drop = pg_schema_url()
    import psycopg  # there: pg_schema_url skips with a reason when it is missing

    blocker = psycopg.connect(url)
    checker = psycopg.connect(url, autocommit=True)
    try:
        with Hub.open(url) as hub:
            pool = ProxyPool(hub)
            pool.add([f"http://127.0.0.1:{port}" for port in range(1, 5)])
            lease = pool.acquire(HOLDER, 60)
            others = [p.id for p in pool.proxies() if p.id != lease.proxy_id]
            backend = hub.query("SELECT pg_backend_pid()")[0][0]  # the rotation's server process
            blocker.execute(
                "SELECT id FROM hub_proxies WHERE id = %s FOR UPDATE", (lease.proxy_id,)
            )
            result: list = []
            rotating = threading.Thread(
                target=lambda: result.append(
                    pool.rotate(lease, "rotated", UsageCounts(1), NO_REST, HOLDER, 60)
                )
            )
            rotating.start()
            try:
                waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = %s"
                deadline, waited = time.monotonic() + 30, False
                while not waited and time.monotonic() < deadline:
                    waited = checker.execute(waiting, (backend,)).fetchone()[0] > 0
                    time.sleep(0.02)
                try:
                    with checker.transaction():
                        rows = checker.execute(
                            "SELECT id FROM hub_proxies WHERE id <> %s ORDER BY id "
                            "FOR UPDATE NOWAIT",
                            (lease.proxy_id,),
                        ).fetchall()
                        free_to_lock = [row[0] for row in rows]
                except psycopg.errors.LockNotAvailable:
                    free_to_lock = None
            finally:
                blocker.commit()  # lets the rotation go on, whatever was found
                rotating.join(30)
            assert waited, "the rotation never waited for its lease's row"
            assert free_to_lock == others, "the rotation held another proxy while it waited"
            assert not rotating.is_alive()
            released, new = result[0]
            assert released and new is not None and new.proxy_id in others
    finally:
        blocker.close()
        checker.close()
        drop()


def _pick_buffers(hub: Hub) -> int:
    """Buffers (index and table pages) a pick of the least recently used free proxy reads."""
    plan = hub.query(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM hub_proxies "
        "WHERE enabled = 1 AND state <> 'leased' ORDER BY COALESCE(last_used, 0), id LIMIT 1"
    )[0][0][0]["Plan"]
    return plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0)


def test_lease_churn_vacuums_the_dead_entries_every_pick_would_wade_through():
    """Each lease leaves a dead entry at the head of the index that picks scan from; the
    leasing processes vacuum the table themselves, one at a time, so picks stay short."""
    url, drop = pg_schema_url()
    try:
        with Hub.open(url) as hub, Hub.open(url) as other:
            pool = ProxyPool(hub)
            pool.add([f"http://127.0.0.1:{port}" for port in range(1, 51)])
            pool.store.VACUUM_SECONDS = 0.0
            stats = (
                "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'hub_proxies'::regclass"
            )

            def churn(rotations: int) -> None:
                lease = pool.acquire(HOLDER, 60)
                for _ in range(rotations):
                    _, lease = pool.rotate(lease, "rotated", UsageCounts(1), NO_REST, HOLDER, 60)
                pool.release(lease, "released", UsageCounts(1), NO_REST)

            pool.store.VACUUM_CHECK_EVERY = 10**9  # first without: what picks face
            churn(3000)
            unvacuumed = _pick_buffers(hub)
            pool.store.VACUUM_CHECK_EVERY = 500
            before = hub.query(stats)[0][0]
            churn(3000)
            assert hub.query(stats)[0][0] - before >= 5, "one vacuum per 500 lease operations"
            # Picks stay short: a quarter of what they read unvacuumed, or a few pages
            # where the server kept the index small by itself.
            picked = _pick_buffers(hub)
            assert picked <= max(8, unvacuumed // 4), (picked, unvacuumed)
            # Never two at once, never more often than VACUUM_SECONDS.
            lock = f"SELECT pg_try_advisory_lock({int(AdvisoryLock.PROXY_VACUUM)})"
            assert other.query(lock)[0][0]
            assert not pool.store.vacuum_if_due(), "another process is vacuuming"
            other.query(f"SELECT pg_advisory_unlock({int(AdvisoryLock.PROXY_VACUUM)})")
            assert pool.store.vacuum_if_due()
            pool.store.VACUUM_SECONDS = 3600.0
            assert not pool.store.vacuum_if_due(), "vacuumed a moment ago"
            held = "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = ?"
            assert hub.query(held, (hub.query("SELECT pg_backend_pid()")[0][0],)) == [(0,)]
    finally:
        drop()


def test_a_failed_vacuum_never_fails_the_lease_operation_before_it(caplog):
    """The vacuum runs after a lease operation has committed: losing the hub during it
    (staged here, as it cannot be timed) must not turn that operation into a failure."""

    def lost(*_):
        raise HubUnavailableError("lost the connection to the hub")

    url, drop = pg_schema_url()
    try:
        with Hub.open(url) as hub:
            pool = ProxyPool(hub)
            pool.store.vacuum_if_due = lost
            pool.store.VACUUM_CHECK_EVERY = 1
            pool.add(["http://127.0.0.1:3128", "http://127.0.0.1:3129"])
            lease = pool.acquire(HOLDER, 60)
            released, lease = pool.rotate(lease, "rotated", UsageCounts(1), NO_REST, HOLDER, 60)
            assert released and lease is not None
            assert pool.release(lease, "released", UsageCounts(1), NO_REST)
    finally:
        drop()
    warnings = [r for r in caplog.records if "Could not vacuum" in r.getMessage()]
    assert len(warnings) == 1 and "leasing goes on" in warnings[0].getMessage()


# --- bad input ---------------------------------------------------------------------------
def test_unreachable_postgres_is_a_clear_error():
    need_module("psycopg")
    with pytest.raises(HubUnavailableError) as info:
        Hub.open("postgresql://bob:hunter2@127.0.0.1:1/x", connect_timeout=5)
    message = str(info.value)
    assert "127.0.0.1:1" in message and "HUB_URL" in message
    assert "hunter2" not in message


def test_silent_hub_times_out_instead_of_hanging():
    """A server that accepts TCP but never answers: the connect timeout ends the wait."""
    need_module("psycopg")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        code = """
            import sys
            from crawler.hub import Hub, HubUnavailableError
            try:
                Hub.open(sys.argv[1], connect_timeout=2)
            except HubUnavailableError as exc:
                print("refused:", exc)
        """
        done = run_python(code, f"postgresql://u@127.0.0.1:{port}/x", timeout=120)
    assert "refused: cannot reach the hub" in done.stdout, done.stderr


def test_bad_hub_urls(tmp_path):
    with pytest.raises(InvalidHubURLError, match="is not supported"):
        Hub.open("mysql://u:hunter2@127.0.0.1/x")
    with pytest.raises(HubUnavailableError, match="does not exist"):
        Hub.open(f"sqlite:///{tmp_path}/missing/dir/hub.db")
    with pytest.raises(InvalidHubURLError):
        Hub.open("")


# --- many processes -----------------------------------------------------------------------
def test_exclusivity_under_contention(pool, hub):
    """16 processes lease, use and release 5 proxies for ~20 s: no lease overlaps another."""
    pool.add([f"http://127.0.0.1:{port}" for port in range(10001, 10006)])
    seconds = os.environ.get("HUB_CONTENTION_SECONDS", "20")
    churn = ("-m", "benchmarks.proxy_churn", hub.url, seconds, "0.01")
    workers = [start_python(*churn) for _ in range(16)]
    counts = []
    for worker in workers:
        out, _ = worker.communicate(timeout=float(seconds) + 180)
        worker.stdout.close()
        assert worker.returncode == 0
        counts.append(int(out.strip()))
    assert all(counts), f"every process got leases: {counts}"
    by_proxy = defaultdict(list)
    for row in pool.usage():
        assert row.ended is not None and row.end_reason == "rotated"
        by_proxy[row.proxy_id].append(row)
    assert sorted(by_proxy) == [1, 2, 3, 4, 5], "every proxy was used"
    assert sum(len(rows) for rows in by_proxy.values()) == sum(counts)
    for proxy_id, rows in by_proxy.items():
        rows.sort(key=lambda r: (r.started, r.id))
        for before, after in zip(rows, rows[1:], strict=False):
            assert after.started >= before.ended, (
                f"proxy {proxy_id}: lease {after.id} started before lease {before.id} ended"
            )
    assert {p.state for p in pool.proxies()} == {"free"}


HOLD_ALL = """
    import sys, time
    from crawler.hub import Holder, Hub, ProxyPool
    pool = ProxyPool(Hub.open(sys.argv[1]))
    holder = Holder.current({"HUB_HOLDER": "doomed"})
    ids = []
    while True:
        lease = pool.acquire(holder, float(sys.argv[2]))
        if lease is None:
            break
        ids.append(lease.proxy_id)
    print(" ".join(map(str, sorted(ids))), flush=True)
    time.sleep(600)
"""

WAIT_FOR_ALL = """
    import sys, time
    from crawler.hub import Holder, Hub, ProxyPool
    pool = ProxyPool(Hub.open(sys.argv[1]))
    wanted, ids = int(sys.argv[2]), []
    deadline = time.monotonic() + 120
    while len(ids) < wanted and time.monotonic() < deadline:
        lease = pool.acquire(Holder.current({"HUB_HOLDER": "heir"}), 60)
        if lease is None:
            time.sleep(0.2)
        else:
            ids.append(lease.proxy_id)
    print(" ".join(map(str, sorted(ids))))
"""


def test_killed_holders_proxies_come_back_after_ttl(pool, hub):
    pool.add(["http://127.0.0.1:1", "http://u:pw@127.0.0.1:2"])
    holder = start_python("-c", textwrap.dedent(HOLD_ALL), hub.url, "3")
    try:
        held = holder.stdout.readline().split()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()
    assert held == ["1", "2"]
    assert all(p.holder and p.holder.endswith("/doomed") for p in pool.proxies())
    heir = run_python(WAIT_FOR_ALL, hub.url, "2", timeout=180)
    assert heir.stdout.split() == ["1", "2"], heir.stderr
    dead = [r for r in pool.usage() if r.task == "doomed"]
    new = [r for r in pool.usage() if r.task == "heir"]
    assert [r.end_reason for r in dead] == ["expired", "expired"]
    for old in dead:
        successor = next(r for r in new if r.proxy_id == old.proxy_id)
        assert successor.started >= old.ended
