"""The queue mode (``slurm/submit --queue``) on a real single-node Slurm cluster.

Tasks lease batches of URLs from a work queue in a PostgreSQL hub (a schema of its own
per test) and crawl the test site in this process; the site counts requests. Every
wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from crawler.hub import Hub, WorkQueue
from tests.checks import assert_rows_readable, rows_by_url
from tests.conftest import ROOT, write_urls
from tests.hubs import pg_schema_url
from tests.polling import wait_until
from tests.slurm_cluster import (  # noqa: F401 - slurm_cluster: the session fixture
    fetched,
    logs,
    shipped_rows,
    slow_urls,
    slurm_cluster,
)

FAST = ["-s", "AUTOTHROTTLE_ENABLED=0", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=4"]
SLOW = ["-s", "AUTOTHROTTLE_ENABLED=0", "-s", "DOWNLOAD_DELAY=1"]
ONE_AT_A_TIME = ["-s", "AUTOTHROTTLE_ENABLED=0", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1"]


@pytest.fixture
def hub_url():
    url, drop = pg_schema_url("slurmq")
    yield url
    drop()


def submit_queue(cluster, urls: Path, data: Path, tmp_path: Path, hub_url: str, name: str,
                 scrapy_args: list[str], batch: int, ttl: float = 60) -> tuple[str, str]:  # fmt: skip
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    env = dict(cluster.env, LOCAL=str(local), SHIP_EVERY="0.05", HUB_URL=hub_url,
               WORK_LEASE_TTL=str(ttl))  # fmt: skip
    cmd = [sys.executable, str(ROOT / "slurm" / "submit"), str(urls), "--queue",
           "--queue-name", name, "--batch", str(batch), "--tasks", "1", "--data", str(data),
           "--time", "10:00", "--margin", "60",
           "--partition-by", "url",  # the test site is one host: batches of any of its URLs
           "--", *scrapy_args]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    array, merge = re.search(r"crawl array (\d+) .* merge job (\d+)", done.stdout).groups()
    return array, merge


def batches_by_array(queue: WorkQueue) -> Counter:
    """Leases per array job (the holder names the array task: host/pid/ARRAY_0/p0)."""
    return Counter(lease["holder"].split("/")[2].split("_")[0] for lease in queue.leases())


def test_submit_queue_needs_a_postgresql_hub(tmp_path):
    urls = write_urls(tmp_path / "urls.txt", ["http://127.0.0.1:1/"])
    cmd = [sys.executable, str(ROOT / "slurm" / "submit"), str(urls), "--queue", "--tasks",
           "1", "--data", str(tmp_path / "data")]  # fmt: skip
    for hub in ("", f"sqlite:///{tmp_path}/hub.db"):
        env = {k: v for k, v in os.environ.items() if k != "HUB_URL"}
        if hub:
            env["HUB_URL"] = hub
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert "HUB_URL" in done.stderr and "postgresql://" in done.stderr


def test_tasks_of_different_speed_share_the_queue(slurm_cluster, site, tmp_path, hub_url):  # noqa: F811
    urls = slow_urls(site, 4000, 40, ms=50)
    url_file = write_urls(tmp_path / "urls.txt", urls)
    # Two submissions of the same queue, one slowed by a per-request delay; each its
    # own data directory, so that each merges its own share. The slow one first: on a
    # loaded machine the fast one, submitted first, once took every batch before the
    # slow one's task had started.
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    a_slow, m_slow = submit_queue(slurm_cluster, url_file, slow, tmp_path, hub_url, "speed",
                                  SLOW, batch=4)  # fmt: skip
    a_fast, m_fast = submit_queue(slurm_cluster, url_file, fast, tmp_path, hub_url, "speed",
                                  FAST, batch=4)  # fmt: skip
    for array, data in ((a_fast, fast), (a_slow, slow)):
        assert slurm_cluster.wait_done(array, timeout=150) == ["COMPLETED"], logs(data)
    for merge, data in ((m_fast, fast), (m_slow, slow)):
        assert slurm_cluster.wait_done(merge, timeout=90) == ["COMPLETED"], logs(data)
    assert set(fetched(site, urls).values()) == {1}, "a URL was fetched twice"
    rows_fast, rows_slow = rows_by_url(fast), rows_by_url(slow)
    assert not set(rows_fast) & set(rows_slow)
    assert sorted({**rows_fast, **rows_slow}) == sorted(urls)
    assert_rows_readable(fast, site)
    assert_rows_readable(slow, site)
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "speed", create=False)
        progress = queue.progress()
        assert progress.finished and progress.done == len(urls)
        taken = batches_by_array(queue)
        assert taken[a_fast] >= 1 and taken[a_slow] >= 1, taken
        assert {lease["end_reason"] for lease in queue.leases()} == {"done"}


def live_batch_started(hub_url: str, array: str, site) -> bool:
    """Whether the array holds a live lease of a batch the site has started serving."""
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "kill", create=False)
        if queue.progress().done == 0:
            return False  # let it finish (and ship) a first batch
        for lease in queue.leases():
            if lease["ended"] is None and f"/{array}_0/" in lease["holder"]:
                rows = hub.query("SELECT url FROM hub_work_items WHERE lease_id = ?",
                                  (lease["id"],))  # fmt: skip
                return any(site.counts[urlsplit(url).path] for (url,) in rows)
    return False


def test_killed_tasks_batch_is_taken_over_after_its_lease(
    slurm_cluster,  # noqa: F811
    site,
    tmp_path,
    hub_url,
):
    urls = slow_urls(site, 5000, 15, ms=1500)
    url_file = write_urls(tmp_path / "urls.txt", urls)
    data = tmp_path / "data"
    ttl = 8
    array, merge = submit_queue(slurm_cluster, url_file, data, tmp_path, hub_url, "kill",
                                ONE_AT_A_TIME, batch=3, ttl=ttl)  # fmt: skip
    wait_until(lambda: live_batch_started(hub_url, array, site), "a second batch to start", 90)
    # Hard kill, mid-batch: nothing is shipped or given back on the way out.
    assert slurm_cluster.kill_task(array, 0) >= 3
    slurm_cluster.run(["scancel", "--signal=KILL", "--full", f"{array}_0"])
    assert "COMPLETED" not in slurm_cluster.wait_done(f"{array}_0", timeout=60)
    slurm_cluster.wait_done(merge, timeout=60)
    shipped = shipped_rows(data)
    before = fetched(site, urls)
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "kill", create=False)
        dead = [lease for lease in queue.leases() if lease["ended"] is None]
        assert len(dead) == 1 and f"/{array}_0/" in dead[0]["holder"]
        dead_urls = {u for (u,) in hub.query(
            "SELECT url FROM hub_work_items WHERE lease_id = ?", (dead[0]["id"],))}  # fmt: skip

    array2, merge2 = submit_queue(slurm_cluster, url_file, data, tmp_path, hub_url, "kill",
                                  FAST, batch=3, ttl=ttl)  # fmt: skip
    assert slurm_cluster.wait_done(array2, timeout=120) == ["COMPLETED"], logs(data)
    assert slurm_cluster.wait_done(merge2, timeout=90) == ["COMPLETED"], logs(data)
    assert sorted(rows_by_url(data)) == sorted(urls), logs(data)
    assert_rows_readable(data, site)
    with Hub.open(hub_url) as hub:
        queue = WorkQueue(hub, "kill", create=False)
        assert queue.progress().finished
        leases = {lease["id"]: lease for lease in queue.leases()}
        assert leases[dead[0]["id"]]["end_reason"] == "expired"
        heirs = [lease for lease in leases.values() if f"/{array2}_0/" in lease["holder"]]
        assert {lease["end_reason"] for lease in heirs} == {"done"}
        assert "taken over from expired lease" in logs(data)
    after = fetched(site, urls)
    for url in urls:
        path = urlsplit(url).path
        if url in shipped:
            assert after[path] == 1, f"{url} was shipped, yet fetched again"
        elif url in dead_urls:
            assert after[path] - before[path] == 1, f"{url}: fetched {after[path]} times"
        else:
            assert after[path] == 1, f"{url}: fetched {after[path]} times"
