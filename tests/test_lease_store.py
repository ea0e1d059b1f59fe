"""One lease scenario run against both lease stores (SQLite, PostgreSQL): take, rotate at
the limit, rest, ban, expiry, heartbeat. Each backend writes the operations its own way
(``crawler/hub/lease_sqlite.py``, ``lease_postgres.py``); what they do must not differ."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from crawler.hub import Holder, Hub, LeaseStore, ProxyPool, RestPolicy, UsageCounts, lease_postgres
from crawler.hub.lease_postgres import PostgresLeaseStore, install_functions
from crawler.hub.lease_sqlite import SQLiteLeaseStore
from crawler.hub.lease_store import Place
from crawler.hub.locks import AdvisoryLock
from tests.hubs import hub_url, pg_schema_url  # noqa: F401 - hub_url: a fixture
from tests.test_lease_pool import rig

HOLDER = Holder("testhost", 1, "job_1")
OTHER = Holder("elsewhere", 2, "job_2")
POLICY = RestPolicy(rest_seconds=30, ban_rest_seconds=100, ban_rest_max_seconds=250, jitter=0)


@pytest.fixture
def hub(hub_url):  # noqa: F811
    with Hub.open(hub_url) as opened:
        yield opened


def _proxy(pool: ProxyPool, proxy_id: int):
    return next(p for p in pool.proxies() if p.id == proxy_id)


def _rest(pool: ProxyPool, proxy_id: int) -> tuple[str, float]:
    row = _proxy(pool, proxy_id)
    return row.state, round(row.resting_until - row.last_used, 3)


def scenario(hub: Hub) -> list[tuple]:
    """What a crawl process and a second holder do to a pool of three proxies, as seen
    in the hub's tables."""
    seen: list[tuple] = []
    r = rig(hub, rotate_every=2, leases_per_process=1, rest=POLICY)
    proxies = r.proxies
    proxies.add([f"http://127.0.0.1:{port}" for port in (1, 2, 3)])

    # Take: the least recently used proxy, twice, up to the limit.
    a, b = r.take(), r.take()
    seen.append(("take", a.proxy_id, b.proxy_id, a.attempt.lease.alive))
    # Rotate at the limit: a third request waits until both finish, then the lease is
    # released and the next proxy leased in one call.
    c = r.take()
    r.pool.finish(a.token, nbytes=10)
    seen.append(("waits", c.attempt is None))
    r.pool.finish(b.token, nbytes=20, failed=True)
    seen.append(("rotated to", c.proxy_id))
    usage = {u.id: u for u in proxies.usage()}
    first = usage[a.attempt.lease.lease_id]
    seen.append(("usage", first.requests, first.bytes, first.failures, first.end_reason))
    # Rest: the rotated proxy rests PROXY_REST_SECONDS and is not leased meanwhile.
    seen.append(("rest", *_rest(proxies, 1)))
    other = proxies.acquire(OTHER, 60)
    seen.append(("other takes", other.proxy_id))
    seen.append(("none free", proxies.acquire(OTHER, 60)))

    # Heartbeat: renews the live lease with its counts; the lease lost is reported lost.
    d = r.take()
    r.pool.finish(d.token, nbytes=5)
    before = _proxy(proxies, 2).lease_expires
    r.clock.advance(20)
    live = _proxy(proxies, 2)
    row = {u.id: u for u in proxies.usage()}[c.attempt.lease.lease_id]
    seen.append(("heartbeat", live.lease_expires > before, row.requests, row.bytes))

    # Ban: the lease ends banned, the proxy rests the ban rest, doubled in a row, capped.
    r.pool.finish(c.token, failed=True, banned=True)
    seen.append(("banned", *_rest(proxies, 2), _proxy(proxies, 2).consecutive_bans))
    for _ in range(2):
        proxies.end_rest(2)
        lease = proxies.store.acquire(HOLDER, 60, avoid=3)
        proxies.release(lease, "banned", UsageCounts(requests=1, bans=1), POLICY)
        seen.append(("banned again", *_rest(proxies, 2)))
    proxies.end_rest(2)
    lease = proxies.store.acquire(HOLDER, 60, avoid=3)
    proxies.release(lease, "released", UsageCounts(), POLICY)
    seen.append(("unused: no rest", *_rest(proxies, 2), _proxy(proxies, 2).consecutive_bans))

    # Expiry: a holder that stopped renewing loses its proxy to the next taker.
    proxies.release(other, "released", UsageCounts(requests=1), RestPolicy(0, 0, 0, 0))
    stale = proxies.store.acquire(HOLDER, -1, avoid=3)
    proxies.set_enabled(3, False)
    fresh = proxies.acquire(OTHER, 60)
    proxies.set_enabled(3, True)
    seen.append(("taken over", fresh.proxy_id == stale.proxy_id))
    seen.append(("renew", proxies.renew_many([(stale, UsageCounts()), (fresh, UsageCounts())], 60)))
    seen.append(("late release", proxies.release(stale, "released", UsageCounts(requests=2))))
    old = {u.id: u for u in proxies.usage()}[stale.lease_id]
    seen.append(("expired", old.end_reason, old.ended == stale.expires, old.requests))
    released, nxt = proxies.rotate(fresh, "rotated", UsageCounts(1), POLICY, OTHER, 60)
    seen.append(("rotate finds", released, nxt.proxy_id if nxt else None))
    closed: list[bool] = []
    r.pool.close(lambda: closed.append(True))
    seen.append(("closed", closed, {p.state for p in proxies.proxies()} - {"resting"}))
    return seen


EXPECTED = [
    ("take", 1, 1, False),
    ("waits", True),
    ("rotated to", 2),
    ("usage", 2, 30, 1, "rotated"),
    ("rest", "resting", 30.0),
    ("other takes", 3),
    ("none free", None),
    ("heartbeat", True, 1, 5),
    ("banned", "banned", 100.0, 1),
    ("banned again", "banned", 200.0),
    ("banned again", "banned", 250.0),
    ("unused: no rest", "free", 0.0, 0),
    ("taken over", True),
    ("renew", [False, True]),
    ("late release", False),
    ("expired", "expired", True, 2),
    ("rotate finds", True, 3),
    ("closed", [True], {"leased"}),
]


def test_both_lease_stores_play_the_same_scenario(hub):
    store = ProxyPool(hub).store
    assert isinstance(store, SQLiteLeaseStore if hub.backend == "sqlite" else PostgresLeaseStore)
    assert isinstance(store, LeaseStore)
    assert scenario(hub) == EXPECTED


def test_a_rerun_of_the_crawl_takes_a_proxy_whose_rest_its_crawl_caused(hub):
    """A rest is the proxy's break from its holder's crawl: another process of that crawl
    (its rerun after Ctrl-C) takes it at once; the process that caused it, another crawl
    and a banned proxy's rest still wait."""
    pool = ProxyPool(hub)
    pool.add(["http://127.0.0.1:1"])
    crawl = "node1:/data/site"
    first = Holder("node1", 100, "", crawl)
    lease = pool.acquire(first, 60)
    assert pool.release(lease, "rotated", UsageCounts(5), POLICY)
    assert _proxy(pool, lease.proxy_id).state == "resting"
    assert pool.acquire(first, 60) is None, "the process that caused the rest waits it out"
    assert pool.acquire(Holder("node1", 101, "", "node1:/data/other"), 60) is None
    assert pool.acquire(Holder("node2", 101, "", ""), 60) is None, "a holder of no crawl waits"
    rerun = Holder("node1", 101, "", crawl)
    waiter = Holder("node3", 7, "")
    assert pool.acquire(waiter, 60, place=Place(work=1000)) is None
    assert pool.acquire(rerun, 60, place=Place(work=10)) is None, "a stronger claim waits"
    pool.leave_line(waiter)
    taken = pool.acquire(rerun, 60, place=Place(work=10))
    assert taken is not None and taken.proxy_id == lease.proxy_id
    assert pool.release(taken, "banned", UsageCounts(1, bans=1), POLICY)
    assert _proxy(pool, lease.proxy_id).state == "banned"
    assert pool.acquire(Holder("node1", 102, "", crawl), 60) is None, "a ban is waited out"


def test_one_rest_formula_feeds_both_stores():
    rests, bans = POLICY.rests(random.Random(0))
    assert (rests, bans) == (30.0, [100.0, 200.0, 250.0])
    jittered = RestPolicy(rest_seconds=10, ban_rest_seconds=10, ban_rest_max_seconds=10)
    rest, bans = jittered.rests(random.Random(1))
    assert 7.5 <= rest <= 12.5 and bans == [rest], "one factor for every rest of a release"
    assert RestPolicy(ban_rest_seconds=0, ban_rest_max_seconds=0).rests(random.Random())[1] == [0]


def test_lease_functions_are_installed_at_start_and_replaced_when_changed(monkeypatch):
    """The functions live in the code, not in a migration: a hub holding another version
    of one (an older release's, or one edited since) gets the current one at the next
    start, under the schema lock; an up-to-date hub is left as it is."""
    url, drop = pg_schema_url()
    import psycopg  # there: pg_schema_url skips with a reason when it is missing

    try:
        with Hub.open(url) as hub:
            ProxyPool(hub)
            assert not install_functions(hub), "up to date: nothing to do"
            # An older definition with another signature, as schema version 4 made it.
            hub.execute(
                "DROP FUNCTION hub_release(bigint, bigint, bigint, bigint, bigint, "
                "bigint, text, double precision, double precision[])"
            )
            hub.execute(
                "CREATE FUNCTION hub_release(p BIGINT, q DOUBLE PRECISION) RETURNS BOOLEAN "
                "LANGUAGE sql AS $$ SELECT FALSE $$"
            )
            pool = ProxyPool(hub)
            functions = hub.query(
                "SELECT p.oid::regprocedure::text FROM pg_proc p "
                "WHERE p.pronamespace = current_schema()::regnamespace ORDER BY 1"
            )
            assert len(functions) == 3, functions
            pool.add(["http://127.0.0.1:1"])
            lease = pool.acquire(HOLDER, 60)
            assert pool.release(lease, "banned", UsageCounts(requests=1, bans=1), POLICY)
            assert _rest(pool, 1) == ("banned", 100.0)
            # An edit of a body here reaches the database at the next start.
            head, body = lease_postgres.FUNCTIONS["hub_take"]
            edited = body.replace("picked RECORD;", "picked RECORD;\n    edited INTEGER;")
            monkeypatch.setitem(lease_postgres.FUNCTIONS, "hub_take", (head, edited))
            assert install_functions(hub)
            source = hub.query(
                "SELECT prosrc FROM pg_proc WHERE proname = 'hub_take' "
                "AND pronamespace = current_schema()::regnamespace"
            )
            assert [("edited INTEGER" in row[0]) for row in source] == [True]
            # Installing takes the schema's lock: while another session holds it, the
            # install waits for it.
            monkeypatch.setitem(lease_postgres.FUNCTIONS, "hub_take", (head, body))
            blocker = psycopg.connect(url)
            try:
                blocker.execute("SELECT pg_advisory_xact_lock(%s)", (AdvisoryLock.PROXY_SCHEMA,))
                backend = hub.query("SELECT pg_backend_pid()")[0][0]
                installing = threading.Thread(target=install_functions, args=(hub,))
                installing.start()
                waited = _waits_for_lock(blocker, backend)
                blocker.commit()
                installing.join(60)
            finally:
                blocker.close()
            assert waited and not installing.is_alive()
            assert not install_functions(hub), "the waiting install put the current ones"
    finally:
        drop()


def _waits_for_lock(observer, backend: int) -> bool:
    """Whether the server process *backend* comes to wait for a lock (bounded poll)."""
    waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = %s"
    deadline = time.monotonic() + 30
    with psycopg_connect_like(observer) as checker:
        while time.monotonic() < deadline:
            if checker.execute(waiting, (backend,)).fetchone()[0]:
                return True
            time.sleep(0.02)
    return False


def psycopg_connect_like(conn):
    import psycopg

    return psycopg.connect(conn.info.dsn, autocommit=True)


def test_advisory_lock_keys_are_one_registry():
    """No two uses share a key (the work-queue schema once shared the vacuum's)."""
    keys = [int(k) for k in AdvisoryLock]
    assert len(keys) == len(set(keys))
    from crawler.hub import hostbudget, jobs, lease_postgres, proxies, workqueue

    for module in (hostbudget, jobs, lease_postgres, proxies, workqueue):
        source = Path(module.__file__).read_text()
        assert "7302519" not in source, f"{module.__name__} spells a key of its own"


def _line(hub: Hub) -> list[str]:
    return [row[0] for row in hub.query("SELECT holder FROM hub_proxy_waiters ORDER BY since")]


def test_scarce_proxies_go_to_the_strongest_claim_in_the_line(hub):
    """The line both stores keep: a free proxy goes to the waiter with the most work
    left, a long wait outweighs it, a further lease yields to every waiter, a lapsed
    place holds no one back, and enough free proxies serve all."""
    pool = ProxyPool(hub)
    pool.add(["http://127.0.0.1:1"])
    no_rest = RestPolicy(0, 0, 0, 0)
    big, small, third = (Holder("node", pid, "") for pid in (1, 2, 3))
    held = pool.acquire(OTHER, 60)
    assert pool.acquire(big, 60, place=Place(work=300)) is None
    assert pool.acquire(small, 60, place=Place(work=12)) is None
    assert _line(hub) == [str(big), str(small)]

    pool.release(held, "released", UsageCounts(1), no_rest)
    assert pool.acquire(small, 60, place=Place(work=12)) is None, "a bigger crawl waits"
    assert pool.acquire(OTHER, 60, place=Place(work=5, further=True)) is None
    assert str(OTHER) not in _line(hub), "a further lease takes no place"
    taken = pool.acquire(big, 60, place=Place(work=300))
    assert taken is not None and _line(hub) == [str(small)]

    assert pool.acquire(big, 60, place=Place(work=300, further=True)) is None
    assert pool.acquire(big, 60, place=Place(work=300)) is None, "its next lease waits"
    pool.release(taken, "released", UsageCounts(1), no_rest)
    # Ten minutes waited weigh more than 300 requests against 12 (log2 steps).
    taken = pool.acquire(small, 60, waited=600, place=Place(work=12))
    assert taken is not None and _line(hub) == [str(big)]

    assert pool.acquire(third, 60, place=Place(work=1000, ttl=-1)) is None, "lapsed at once"
    pool.release(taken, "released", UsageCounts(1), no_rest)
    hub.execute("UPDATE hub_proxy_waiters SET expires = NOW() - 1 WHERE holder = ?", (str(big),))
    taken = pool.acquire(small, 60, place=Place(work=1))
    assert taken is not None, "lapsed places hold no one back"
    assert pool.acquire(third, 60) is None, "none free"

    pool.add(["http://127.0.0.1:2", "http://127.0.0.1:3"])
    hub.execute("UPDATE hub_proxy_waiters SET expires = NOW() + 60 WHERE holder = ?", (str(big),))
    first = pool.acquire(OTHER, 60, place=Place(work=0))
    assert first is not None, "two free proxies for one stronger waiter: one is for this taker"
    assert pool.acquire(OTHER, 60, place=Place(work=0, further=True)) is None
    assert pool.acquire(OTHER, 60) is not None, "without a place, the line is not asked"
