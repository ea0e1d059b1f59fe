"""A crawl whose PostgreSQL hub goes away and comes back, and one whose hub is not there.

The hub is a cluster of the test's own (tests/pg_cluster.py), stopped mid-crawl for
longer than a lease lives and started again; three real tinyproxies carry the requests.
Requests wait at their host's gate after they are given a lease, and the host's slots
outlive the leases: those released once the leases ran out must not go on them.
What a proxy's own log says it forwarded is checked against the leases the hub recorded.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections import Counter, defaultdict
from datetime import datetime

import pytest

from crawler.hub import Hub, ProxyPool
from crawler.hub.hostbudget import HostBudgetStore
from tests import launcher
from tests.checks import response_records
from tests.conftest import ROOT, crawl_command, crawl_env, start_crawl, write_urls
from tests.pg_cluster import PgCluster
from tests.polling import wait_until
from tests.proxy_servers import TinyProxy
from tests.servers import free_port, need

PAGES = 300
TTL = 6.0  # PROXY_LEASE_TTL of the crawl
OUTAGE = TTL + 4  # the hub stays away at least this long: every lease runs out meanwhile
SETTINGS = {
    "PROXY_LEASE_TTL": TTL,
    "PROXY_HEARTBEAT_SECONDS": 1,
    "PROXY_ROTATE_EVERY": 1000,  # the leases held when the hub goes away live through it
    "PROXY_REST_SECONDS": 0,
    "PROXY_POLL_SECONDS": 0.5,
    "PROXY_LEASES_PER_PROCESS": 2,
    # Up to twice CONCURRENT_REQUESTS wait at the host's gate, one going every
    # DOWNLOAD_DELAY: a request waits there longer than a lease is chosen to last for.
    "CONCURRENT_REQUESTS": 16,
    "DOWNLOAD_DELAY": 0.2,  # the crawl lasts longer than the outage
    "ROBOTSTXT_OBEY": False,
}


@pytest.fixture
def cluster():
    pg = PgCluster()
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def proxies(tmp_path):
    if shutil.which("tinyproxy") is None:
        need("tinyproxy is not installed (Debian: apt-get install tinyproxy)")
    directory = tmp_path / "tinyproxy"
    directory.mkdir()
    started = [TinyProxy(f"restart-{n}", directory) for n in range(3)]
    try:
        for proxy in started:
            proxy.start()
        yield started
    finally:
        for proxy in started:
            proxy.stop()


def forwarded(proxy: TinyProxy) -> list[float]:
    """When the proxy received each request, by its own log (this machine's local time)."""
    times = []
    year = datetime.now().year
    for line in proxy.requests_logged():
        stamp = " ".join(line.split()[1:4])  # e.g. "Nov 30 22:42:01.795"
        parsed = datetime.strptime(f"{year} {stamp}", "%Y %b %d %H:%M:%S.%f")
        times.append(parsed.timestamp())
    return times


@pytest.mark.parametrize("per_proxy", [False, True], ids=["host-budget", "host-proxy-budget"])
def test_crawl_waits_for_a_restarted_hub_and_never_uses_an_unproved_lease(
    site, tmp_path, data_dir, cluster, proxies, per_proxy
):
    with Hub.open(cluster.url) as hub:
        ProxyPool(hub).add([proxy.url for proxy in proxies])
    urls = [f"{site.base_url}/page/{n}.html" for n in range(PAGES)]
    settings = {**SETTINGS, "HOST_BUDGET_PER_PROXY": per_proxy}
    args = [f"HUB_URL={cluster.url}"] + [f"{k}={v}" for k, v in settings.items()]
    log_path = tmp_path / "crawl.log"
    crawl = start_crawl(
        write_urls(tmp_path / "urls.txt", urls),
        data_dir,
        *[arg for setting in args for arg in ("-s", setting)],
        log_path=log_path,
    )
    try:
        wait_until(
            lambda: sum(len(p.requests_logged()) for p in proxies) >= PAGES // 5,
            "the crawl to be under way",
            proc=crawl,
        )
        cluster.stop()
        stopped = time.time()
        wait_until(
            lambda: "Lost the hub" in log_path.read_text(), "the crawl to notice", proc=crawl
        )
        time.sleep(max(stopped + OUTAGE - time.time(), 0))  # shapes the outage; asserts nothing
        restarted = time.time()
        cluster.start()
        assert crawl.wait(timeout=300) == 0, log_path.read_text()[-5000:]
    finally:
        if crawl.poll() is None:
            crawl.kill()
            crawl.wait()
    log = log_path.read_text()
    assert log.count("Lost the hub") == 1 and log.count("is back after") == 1, log[-5000:]

    # Every page stored once.
    with sqlite3.connect(data_dir / "metadata.db") as catalog:
        stored = catalog.execute("SELECT url, status FROM artifacts").fetchall()
    assert sorted(url for url, _ in stored) == sorted(urls)
    assert {status for _, status in stored} == {200}
    records = response_records(data_dir)
    assert len(records) == PAGES and set(records.values()) == {1}

    # Every request a proxy forwarded fell inside a lease of that proxy, leases of one
    # proxy never overlapped, and once the leases held when the hub went away had run
    # out, nothing went through any proxy until the hub was back.
    with Hub.open(cluster.url) as hub:
        pool = ProxyPool(hub)
        ids = {row.url: row.id for row in pool.proxies()}
        usage = defaultdict(list)
        for row in pool.usage():
            usage[row.proxy_id].append((row.started, row.ended or float("inf")))
        budgets = {state.key for state in HostBudgetStore.open(hub).hosts()}
    assert all((" via " in key) == per_proxy for key in budgets), budgets
    slack = 0.002  # tinyproxy logs milliseconds
    sent = Counter()
    for proxy in proxies:
        leases = sorted(usage[ids[proxy.url]])
        for before, after in zip(leases, leases[1:], strict=False):
            assert after[0] >= before[1], f"{proxy.name}: leases {before} and {after} overlap"
        for at in forwarded(proxy):
            assert any(s - slack <= at <= e + slack for s, e in leases), (
                f"{proxy.name} forwarded a request at {at:.3f} outside its leases {leases}"
            )
            sent["unproved" if stopped + TTL < at < restarted else "proved"] += 1
    assert sent["unproved"] == 0, sent
    assert sent["proved"] >= PAGES


def test_unreachable_hub_at_start_is_exit_2_before_anything_is_fetched(site, tmp_path, data_dir):
    port = free_port()
    url = f"{site.base_url}/page/1.html"
    site.reset_counts()
    env = {**crawl_env(), "HUB_URL": f"postgresql://bob:hunter2@127.0.0.1:{port}/crawl"}
    done = launcher.run(
        crawl_command(write_urls(tmp_path / "urls.txt", [url]), data_dir, "-s",
                      "HUB_CONNECT_TIMEOUT=3"),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], done.stderr[-3000:]
    assert "hunter2" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    assert sum(site.counts.values()) == 0
