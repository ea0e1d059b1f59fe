"""Stopping Slurm tasks: ``scancel`` ships without requeueing, ``MAX_REQUEUES`` bounds
the requeues, and a resubmission with another number of tasks finishes the list.

One download at a time (CONCURRENT_REQUESTS=1) and a request the site holds in flight
make each stop land at a known point: the signal is sent once the held request is
being served, and the gate is opened once the crawl has logged the signal.
"""

from __future__ import annotations

from tests.checks import assert_rows_readable, rows_by_url
from tests.conftest import write_urls
from tests.events import wait_for_log, wait_until
from tests.slurm_cluster import slurm_cluster  # noqa: F401 - the session fixture
from tests.slurm_jobs import FAST, logs, served, shipped_urls, submit

ONE_AT_A_TIME = [*FAST, "-s", "CONCURRENT_REQUESTS=1"]


def url_list(site, first: int, held: list[int], count: int = 30) -> list[str]:
    """``count`` pages from ``first``; the pages at the offsets in ``held`` are held."""
    base = site.base_url
    return [
        f"{base}/hold/page/{first + k}.html" if k in held else f"{base}/page/{first + k}.html"
        for k in range(count)
    ]


def crawl_log(data, array: str, restart: int):
    return data / "logs" / f"{array}_0_r{restart}_p0.log"


def test_scancel_stops_gracefully_ships_and_does_not_requeue(slurm_cluster, site, tmp_path):  # noqa: F811
    urls = url_list(site, 210, held=[5])
    data = tmp_path / "data"
    site.reset_counts()
    site.hold()
    try:
        array, merge = submit(slurm_cluster, write_urls(tmp_path / "urls.txt", urls), data, 1,
                              tmp_path, scrapy_args=ONE_AT_A_TIME)  # fmt: skip
        wait_until(lambda: site.counts["/hold/page/215.html"], "the held request", timeout=120)
        done = slurm_cluster.run(["scancel", f"{array}_0"])
        assert done.returncode == 0, done.stderr
        wait_for_log(crawl_log(data, array, 0), "Received SIGTERM, shutting down gracefully")
    finally:
        site.release()
    states = slurm_cluster.wait_done(f"{array}_0", timeout=120)
    assert states == ["CANCELLED"], logs(data)
    assert slurm_cluster.job_field(f"{array}_0", "Restarts") == "0"
    assert not crawl_log(data, array, 1).exists(), "it ran again"
    # Graceful: every page the site served, the held one included, was shipped.
    fetched = {u for u, n in served(site, urls).items() if n}
    assert urls[5] in fetched and len(fetched) < len(urls)
    assert set(shipped_urls(data)) == fetched, logs(data)
    assert slurm_cluster.wait_done(merge, timeout=90) == ["COMPLETED"], logs(data)
    assert set(rows_by_url(data)) == fetched
    assert_rows_readable(data, site)


def test_max_requeues_then_a_resubmission_with_more_tasks_finishes(slurm_cluster, site, tmp_path):  # noqa: F811
    # Held: page 235 in the first run, page 250 in the second (requested only then).
    urls = url_list(site, 230, held=[5, 20], count=40)
    url_file = write_urls(tmp_path / "urls.txt", urls)
    data = tmp_path / "data"
    site.reset_counts()
    site.hold()
    try:
        array, merge = submit(slurm_cluster, url_file, data, 1, tmp_path,
                              env={"MAX_REQUEUES": "1"}, scrapy_args=ONE_AT_A_TIME)  # fmt: skip
        task = f"{array}_0"
        for restart, held in ((0, "/hold/page/235.html"), (1, "/hold/page/250.html")):
            wait_until(lambda h=held: site.counts[h], f"run {restart}: the held request")
            done = slurm_cluster.run(["scancel", "--signal=USR1", "--batch", task])
            assert done.returncode == 0, done.stderr
            wait_for_log(crawl_log(data, array, restart), "Received SIGTERM, shutting down")
            site.release()
            if restart == 0:
                # Shut again before the requeued run gets to its held page.
                wait_until(lambda: slurm_cluster.job_field(task, "Restarts") == "1", "a requeue")
                site.hold()
    finally:
        site.release()
    states = slurm_cluster.wait_done(task, timeout=120)
    assert states == ["FAILED"], logs(data)  # stopped early: exit status 75, not requeued
    assert slurm_cluster.job_field(task, "Restarts") == "1", logs(data)
    assert logs(data).count(f"requeueing {task}") == 1
    assert slurm_cluster.wait_done(merge, timeout=90) == ["COMPLETED"], logs(data)
    first = {u for u, n in served(site, urls).items() if n}
    assert set(rows_by_url(data)) == first and len(first) < len(urls)

    # The same list again, with three tasks: only the rest is fetched, each page once.
    array2, merge2 = submit(slurm_cluster, url_file, data, 3, tmp_path, scrapy_args=FAST)
    assert slurm_cluster.wait_done(array2, timeout=150) == ["COMPLETED"] * 3, logs(data)
    assert slurm_cluster.wait_done(merge2, timeout=90) == ["COMPLETED"], logs(data)
    assert set(rows_by_url(data)) == set(urls)
    assert set(served(site, urls).values()) == {1}, "a page was fetched twice"
    assert_rows_readable(data, site)
