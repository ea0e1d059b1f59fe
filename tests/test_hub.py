"""The hub's proxy table and leases, on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from crawler.hub import (
    SCHEMA_VERSION,
    Holder,
    Hub,
    HubUnavailableError,
    InvalidHubURLError,
    InvalidProxyURLError,
    RestPolicy,
    UsageCounts,
    normalize_proxy_url,
    redact_url,
)
from tests.servers import need, need_module

ROOT = Path(__file__).resolve().parent.parent
PG_TEST_URL = os.environ.get("PG_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")
HOLDER = Holder("testhost", 1, "job_1")
NO_REST = RestPolicy(rest_seconds=0, ban_rest_seconds=0, jitter=0)


def with_search_path(url: str, schema: str) -> str:
    sep = "&" if urlsplit(url).query else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def pg_schema_url(prefix: str = "hubtest"):
    """Create a fresh schema; return (url using it, drop function)."""
    try:
        import psycopg
    except ImportError:
        need("psycopg is not installed: pip install 'psycopg[binary]'")
    schema = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(PG_TEST_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        need(f"no PostgreSQL at {redact_url(PG_TEST_URL)} (set PG_TEST_URL): {exc}")
    admin.execute(f'CREATE SCHEMA "{schema}"')

    def drop() -> None:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()

    return with_search_path(PG_TEST_URL, schema), drop


@pytest.fixture(params=["sqlite", "postgresql"])
def hub_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/hub.db"
        return
    url, drop = pg_schema_url()
    yield url
    drop()


@pytest.fixture
def hub(hub_url):
    with Hub.open(hub_url) as opened:
        yield opened


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )


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
def test_schema_creation_is_idempotent_and_versioned(hub_url):
    for _ in range(3):
        with Hub.open(hub_url) as hub:
            assert hub.schema_version() == SCHEMA_VERSION
    with Hub.open(hub_url) as hub:
        assert hub._query("SELECT COUNT(*) FROM hub_schema")[0][0] == 1


def test_add_list_disable_enable(hub):
    assert hub.add_proxies(["http://u:pw@127.0.0.1:3128", "http://127.0.0.1:3129/"]) == (2, 0)
    assert hub.add_proxies(["http://127.0.0.1:3129"]) == (0, 1)
    with pytest.raises(InvalidProxyURLError):
        hub.add_proxies(["http://127.0.0.1:3130", "nonsense"])
    assert len(hub.proxies()) == 2, "a batch with a bad URL adds nothing"
    first = hub.find_proxy("http://u:***@127.0.0.1:3128")
    assert first.url == "http://u:pw@127.0.0.1:3128" and "pw" not in repr(first)
    hub.set_enabled(first.id, False)
    assert hub.enabled_count() == 1
    lease = hub.acquire(HOLDER, 60)
    assert lease is not None and lease.proxy_id != first.id
    assert hub.acquire(HOLDER, 60) is None, "the disabled proxy is never leased"
    hub.set_enabled(first.id, True)
    assert hub.acquire(HOLDER, 60).proxy_id == first.id


# --- leases ----------------------------------------------------------------------------
def test_lease_is_exclusive_and_release_closes_usage(hub):
    hub.add_proxies(["http://u:pw@127.0.0.1:1", "http://127.0.0.1:2"])
    a, b = hub.acquire(HOLDER, 60), hub.acquire(HOLDER, 60)
    assert {a.proxy_id, b.proxy_id} == {1, 2}
    assert a.label == "http://u:***@127.0.0.1:1" or b.label == "http://u:***@127.0.0.1:1"
    assert hub.acquire(HOLDER, 60) is None
    assert hub.renew(a, 60, UsageCounts(requests=3, bytes=300))
    assert hub.release(a, "rotated", UsageCounts(requests=1, bytes=10), NO_REST)
    row = next(r for r in hub.usage() if r.id == a.lease_id)
    assert (row.requests, row.bytes, row.end_reason) == (4, 310, "rotated")
    assert row.ended >= row.started and (row.host, row.pid, row.task) == ("testhost", 1, "job_1")
    proxy = next(p for p in hub.proxies() if p.id == a.proxy_id)
    assert (proxy.state, proxy.total_uses, proxy.holder) == ("free", 4, None)
    again = hub.acquire(HOLDER, 60)
    assert again.proxy_id == a.proxy_id and again.lease_id != a.lease_id
    assert not hub.release(a, "released"), "a lease ends once"


def test_rest_after_rotation_and_exponential_ban_rest(hub):
    hub.add_proxies(["http://127.0.0.1:1"])
    policy = RestPolicy(rest_seconds=50, ban_rest_seconds=100, ban_rest_max_seconds=1000, jitter=0)
    lease = hub.acquire(HOLDER, 60)
    hub.release(lease, "rotated", UsageCounts(requests=5), policy)
    assert hub.acquire(HOLDER, 60) is None, "a rotated proxy rests"
    rests = []
    for _ in range(3):
        hub.end_rest()
        lease = hub.acquire(HOLDER, 60)
        hub.release(lease, "banned", UsageCounts(requests=1, bans=1, failures=1), policy)
        proxy = hub.proxies()[0]
        assert proxy.state == "banned" and proxy.effective_state(hub.now()) == "banned"
        rests.append(proxy.resting_until - proxy.last_used)
    assert [round(r) for r in rests] == [100, 200, 400]
    hub.end_rest()
    hub.release(hub.acquire(HOLDER, 60), "rotated", UsageCounts(requests=1), policy)
    assert hub.proxies()[0].consecutive_bans == 0 and hub.proxies()[0].bans == 3


def test_expired_lease_is_taken_over_and_its_holder_told(hub):
    hub.add_proxies(["http://127.0.0.1:1"])
    stale = hub.acquire(HOLDER, -1)  # already expired: as if its holder had died
    fresh = hub.acquire(Holder("other", 2), 60)
    assert fresh is not None and fresh.proxy_id == stale.proxy_id
    assert not hub.renew(stale, 60), "the old holder learns it lost the lease"
    assert not hub.release(stale, "released")
    old = next(r for r in hub.usage() if r.id == stale.lease_id)
    assert old.end_reason == "expired" and old.ended <= fresh.started
    assert hub.renew(fresh, 60)


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
CHURN = """
    import sys
    from crawler.hub import churn
    print(churn(sys.argv[1], float(sys.argv[2]), hold_seconds=0.01))
"""


def test_exclusivity_under_contention(hub):
    """8 processes lease, use and release 5 proxies for ~20 s: no lease overlaps another."""
    hub.add_proxies([f"http://127.0.0.1:{port}" for port in range(10001, 10006)])
    seconds = os.environ.get("HUB_CONTENTION_SECONDS", "20")
    workers = [start_python(CHURN, hub.url, seconds) for _ in range(8)]
    counts = []
    for worker in workers:
        out, _ = worker.communicate(timeout=float(seconds) + 180)
        worker.stdout.close()
        assert worker.returncode == 0
        counts.append(int(out.strip()))
    assert all(counts), f"every process got leases: {counts}"
    by_proxy = defaultdict(list)
    for row in hub.usage():
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
    assert {p.state for p in hub.proxies()} == {"free"}


HOLD_ALL = """
    import sys, time
    from crawler.hub import Holder, Hub
    hub = Hub.open(sys.argv[1])
    holder = Holder.current({"HUB_HOLDER": "doomed"})
    ids = []
    while True:
        lease = hub.acquire(holder, float(sys.argv[2]))
        if lease is None:
            break
        ids.append(lease.proxy_id)
    print(" ".join(map(str, sorted(ids))), flush=True)
    time.sleep(600)
"""

WAIT_FOR_ALL = """
    import sys, time
    from crawler.hub import Holder, Hub
    hub = Hub.open(sys.argv[1])
    wanted, ids = int(sys.argv[2]), []
    deadline = time.monotonic() + 120
    while len(ids) < wanted and time.monotonic() < deadline:
        lease = hub.acquire(Holder.current({"HUB_HOLDER": "heir"}), 60)
        if lease is None:
            time.sleep(0.2)
        else:
            ids.append(lease.proxy_id)
    print(" ".join(map(str, sorted(ids))))
"""


def test_killed_holders_proxies_come_back_after_ttl(hub):
    hub.add_proxies(["http://127.0.0.1:1", "http://u:pw@127.0.0.1:2"])
    holder = start_python(HOLD_ALL, hub.url, "3")
    try:
        held = holder.stdout.readline().split()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()
    assert held == ["1", "2"]
    assert all(p.holder and p.holder.endswith("/doomed") for p in hub.proxies())
    heir = run_python(WAIT_FOR_ALL, hub.url, "2", timeout=180)
    assert heir.stdout.split() == ["1", "2"], heir.stderr
    dead = [r for r in hub.usage() if r.task == "doomed"]
    new = [r for r in hub.usage() if r.task == "heir"]
    assert [r.end_reason for r in dead] == ["expired", "expired"]
    for old in dead:
        successor = next(r for r in new if r.proxy_id == old.proxy_id)
        assert successor.started >= old.ended
