"""A host's limits hold across a cluster: real task processes (``python -m slurm.task``,
2 tasks x 4 crawl processes, as ``slurm/crawl.sbatch`` runs them, without Slurm), in
shard mode and in queue mode (a SQLite hub, a PostgreSQL hub), crawl six hosts, one of
them holding half the URLs, each host served by its own server on 127.0.0.1 that logs
when every request started and ended (``tests/hostservers.py``).

With ``DOWNLOAD_DELAY=0.5``, no jitter (``DOWNLOAD_DELAY_JITTER=0``, what
``RANDOMIZE_DOWNLOAD_DELAY=0`` did in older Scrapy) and
``CONCURRENT_REQUESTS_PER_DOMAIN=1``, no server sees more than 21 requests in any 10 s
nor two at once, and every URL is stored once, as the shipped catalogs read with the
sqlite3 module say. The servers' logs decide, not durations.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from crawler.domains import registered_domain
from crawler.hub import Hub, WorkQueue
from tests.conftest import ROOT, kill_group, write_urls
from tests.hostservers import HostServers
from tests.hubs import hub_url, scrapy_with_hub  # noqa: F401 - hub_url: a fixture

TASKS, PROCS = 2, 4
BIG = "www.big-site.com"
HOSTS = [BIG, "shop.alpha.co.uk", "beta.org", "www.gamma.net", "delta.io", "news.epsilon.de"]
POLITE = [
    "-s", "DOWNLOAD_DELAY=0.5", "-s", "DOWNLOAD_DELAY_JITTER=0",
    "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1", "-s", "AUTOTHROTTLE_ENABLED=0",
    "-s", "LOG_LEVEL=INFO",
    # What splits the work is under test here, not the hub's host budgets (which hold a
    # host to its limits on their own: tests/test_host_budget*.py).
    "-s", "HOST_BUDGET_ENABLED=0",
]  # fmt: skip


def host_urls(hosts: HostServers) -> list[str]:
    """Half of the URLs on one host, the rest spread over five; interleaved, as a list
    made from a sitemap and some links would be."""
    big = hosts.urls(BIG, 20)
    small = [url for host in HOSTS[1:] for url in hosts.urls(host, 4)]
    return [url for pair in zip(big, small, strict=True) for url in pair]


def run_tasks(tmp_path: Path, url_file: Path, args: list[str], env: dict | None = None) -> Path:
    """Run the array's tasks to their end; returns the data directory."""
    data = tmp_path / "data"
    tasks = []
    try:
        for i in range(TASKS):
            stage = tmp_path / f"stage{i}"
            stage.mkdir()
            cmd = [sys.executable, "-m", "slurm.task", "--urls", str(url_file), "--data",
                   str(data), "--stage", str(stage), "--task", str(i), "--tasks", str(TASKS),
                   "--procs", str(PROCS), "--name", f"t{i}", "--ship-every", "0.05", *args]  # fmt: skip
            with open(tmp_path / f"task{i}.log", "w") as log:
                tasks.append(subprocess.Popen(
                    cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                ))  # fmt: skip
        codes = [task.wait(timeout=240) for task in tasks]
    finally:
        for task in tasks:
            kill_group(task)
    logs = "\n".join((tmp_path / f"task{i}.log").read_text()[-2000:] for i in range(TASKS))
    assert codes == [0] * TASKS, logs
    return data


def stored_urls(data: Path) -> Counter:
    """Rows of every shipped catalog, by URL, read as any SQLite reader would."""
    stored: Counter = Counter()
    catalogs = sorted((data / "catalogs").glob("*.db"))
    assert catalogs, f"nothing shipped to {data}"
    for db in catalogs:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            stored.update(url for (url,) in conn.execute("SELECT url FROM artifacts"))
    return stored


@pytest.fixture
def hosts():
    with HostServers(HOSTS, latency=0.05) as servers:
        yield servers


def check(hosts: HostServers, data: Path, urls: list[str]) -> None:
    assert hosts.check_polite(window=10.0, most=21) == []
    assert stored_urls(data) == Counter(urls)
    for server in hosts:
        pages = Counter(r.path for r in server.log() if r.path != "/robots.txt")
        assert set(pages.values()) == {1}, f"{server.name}: a page fetched twice: {pages}"


def test_shards_keep_each_host_to_its_limits(hosts, tmp_path):
    urls = host_urls(hosts)
    url_file = write_urls(tmp_path / "urls.txt", urls)
    data = run_tasks(tmp_path, url_file, ["--", *POLITE, *hosts.setting_args()])
    check(hosts, data, urls)
    # One crawl process fetched each host: its robots.txt was asked for once.
    assert [server.hits("/robots.txt") for server in hosts] == [1] * len(HOSTS)


def test_queue_batches_keep_each_host_to_its_limits(hosts, tmp_path, hub_url):  # noqa: F811
    urls = host_urls(hosts)
    url_file = write_urls(tmp_path / "urls.txt", urls)
    # The default partition: a batch per registered domain; the big host takes two.
    # Loaded with the default settings (8 holders a unit, as host budgets allow); the
    # tasks' crawls have none: they share no site all the same.
    loaded = scrapy_with_hub("queue", "load", "polite", str(url_file), hub=hub_url)
    assert loaded.returncode == 0, loaded.stderr
    args = ["--queue", "polite", "--batch", "10", "--", *POLITE, *hosts.setting_args()]
    data = run_tasks(tmp_path, url_file, args, env={"HUB_URL": hub_url, "WORK_LEASE_TTL": "12"})
    check(hosts, data, urls)
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "polite", create=False)
        assert queue.progress().finished
        leases = queue.leases()
        batches = [
            {urlsplit_host(url) for (url,) in hub.query(
                "SELECT url FROM hub_work_items WHERE lease_id = ?", (lease["id"],))}
            for lease in leases
        ]  # fmt: skip
    assert all(len({registered_domain(h) for h in hosts_of}) == 1 for hosts_of in batches)
    assert sum(1 for hosts_of in batches if hosts_of == {BIG}) == 2
    assert {lease["end_reason"] for lease in leases} == {"done"}


def urlsplit_host(url: str) -> str:
    return url.split("/")[2].split(":")[0]
