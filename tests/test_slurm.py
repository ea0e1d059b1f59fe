"""Crawls as Slurm job arrays on a real single-node cluster (tests/slurm_cluster.py).

Each test submits with ``slurm/submit`` against the test site (in this process, on
127.0.0.1, which the jobs reach) and checks the shared data directory and the site's
request counts. Slow pages make signals land mid-crawl; every wait is bounded.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from crawler.storage.catalog import Catalog
from tests.checks import assert_rows_readable, rows_by_url
from tests.conftest import ROOT, write_urls
from tests.polling import wait_until
from tests.slurm_cluster import (  # noqa: F401 - slurm_cluster: the session fixture
    fetched,
    logs,
    shipped_rows,
    slow_urls,
    slurm_cluster,
)

SCRAPY_ARGS = ["-s", "AUTOTHROTTLE_ENABLED=0", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=4"]


def submit(cluster, urls: Path, data: Path, tasks: int, tmp_path: Path, procs: int = 1):
    env = dict(cluster.env, LOCAL=str(tmp_path / "local"), SHIP_EVERY="0.05")  # 3 s
    (tmp_path / "local").mkdir(exist_ok=True)
    cmd = [sys.executable, str(ROOT / "slurm" / "submit"), str(urls), "--tasks", str(tasks),
           "--procs", str(procs), "--data", str(data), "--time", "10:00", "--margin", "60",
           "--partition-by", "url",  # the test site is one host: split its URLs by key
           "--", *SCRAPY_ARGS]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    array, merge = re.search(r"crawl array (\d+) .* merge job (\d+)", done.stdout).groups()
    return array, merge


def assert_merged(cluster, merge: str, data: Path, site, urls: list[str]) -> None:
    states = cluster.wait_done(merge, timeout=90)
    assert states == ["COMPLETED"], logs(data)
    rows = rows_by_url(data)
    assert sorted(rows) == sorted(urls), logs(data)
    assert_rows_readable(data, site)


def test_array_crawls_its_list_to_completion(slurm_cluster, site, tmp_path):  # noqa: F811
    urls = slow_urls(site, 1000, 60, ms=30)
    data = tmp_path / "data"
    # Two tasks of two crawl processes each: four shards, four shipped catalogs.
    url_file = write_urls(tmp_path / "urls.txt", urls)
    array, merge = submit(slurm_cluster, url_file, data, 2, tmp_path, procs=2)
    states = slurm_cluster.wait_done(array, timeout=120)
    assert states == ["COMPLETED"] * 2, logs(data)
    assert_merged(slurm_cluster, merge, data, site, urls)
    assert set(fetched(site, urls).values()) == {1}  # every page once, over all tasks
    shipped = sorted(p.name for p in (data / "catalogs").glob("*.db"))
    assert shipped == [f"{array}_{t}_r0_p{k}.db" for t in range(2) for k in range(2)]
    for db in shipped:
        with Catalog(data / "catalogs" / db, readonly=True) as catalog:
            assert catalog.count() > 0
    assert "rows" in (data / "logs" / f"merge_{merge}.out").read_text()
    assert not list((tmp_path / "local").iterdir())  # staging removed


def test_usr1_stops_ships_and_requeues_itself(slurm_cluster, site, tmp_path):  # noqa: F811
    urls = slow_urls(site, 2000, 80, ms=300)
    # Held in flight at the signal: the first run cannot finish before it.
    urls.insert(10, f"{site.base_url}/hold/page/380.html")
    data = tmp_path / "data"
    site.hold()
    try:
        array, merge = submit(slurm_cluster, write_urls(tmp_path / "urls.txt", urls), data, 1,
                              tmp_path)  # fmt: skip
        wait_until(lambda: site.counts["/hold/page/380.html"], "the held request", 90)
        done = slurm_cluster.run(["scancel", "--signal=USR1", "--batch", f"{array}_0"])
        assert done.returncode == 0, done.stderr
        crawl_log = data / "logs" / f"{array}_0_r0_p0.log"
        wait_until(lambda: "Received SIGTERM" in crawl_log.read_text(), "the crawl to stop", 90)
    finally:
        site.release()
    states = slurm_cluster.wait_done(f"{array}_0", timeout=150)
    assert states == ["COMPLETED"], logs(data)
    assert slurm_cluster.job_field(f"{array}_0", "Restarts") == "1"
    assert f"requeueing {array}_0" in logs(data)
    first_run = shipped_rows(data)  # r0's catalog, shipped on the way out, and r1's
    assert (data / "catalogs" / f"{array}_0_r0_p0.db").exists()
    assert (data / "catalogs" / f"{array}_0_r0_p0.fetch_log.jsonl").exists()
    assert len(first_run) > 0
    assert_merged(slurm_cluster, merge, data, site, urls)
    # Graceful: what was in flight was stored and shipped; the second run fetched
    # only the rest.
    assert set(fetched(site, urls).values()) == {1}


def test_kill_then_resubmit_loses_nothing_shipped(slurm_cluster, site, tmp_path):  # noqa: F811
    urls = slow_urls(site, 3000, 120, ms=400)
    urls.insert(3, f"{site.base_url}/hold/page/381.html")  # never answered before the kill
    data = tmp_path / "data"
    url_file = write_urls(tmp_path / "urls.txt", urls)
    site.hold()
    try:
        array, merge = submit(slurm_cluster, url_file, data, 1, tmp_path)
        wait_until(lambda: len(shipped_rows(data)) >= 5, "a first shipment", 90)
        # Hard kill: every process at once, nothing shipped on the way out. Then the
        # same through Slurm, which ends the job.
        assert slurm_cluster.kill_task(array, 0) >= 3  # batch script, task runner, crawl...
    finally:
        site.release()
    slurm_cluster.run(["scancel", "--signal=KILL", "--full", f"{array}_0"])
    assert "COMPLETED" not in slurm_cluster.wait_done(f"{array}_0", timeout=60)
    slurm_cluster.wait_done(merge, timeout=60)
    shipped = shipped_rows(data)  # complete and readable after the kill
    before = fetched(site, urls)
    assert 5 <= len(shipped) < len(urls)

    array2, merge2 = submit(slurm_cluster, url_file, data, 1, tmp_path)
    assert slurm_cluster.wait_done(array2, timeout=120) == ["COMPLETED"], logs(data)
    assert_merged(slurm_cluster, merge2, data, site, urls)
    after = fetched(site, urls)
    for url in urls:
        path = urlsplit(url).path
        if url in shipped:
            assert after[path] == 1, f"{url} was shipped, yet fetched again"
        else:
            assert after[path] - before[path] == 1, f"{url}: fetched {after[path]} times"
    merged = rows_by_url(data)
    for url, row in shipped.items():
        assert merged[url].payload_digest == row.payload_digest
