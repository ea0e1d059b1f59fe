"""The queue runner on one machine with a SQLite hub, watched with its ``status`` command.

The commands are the ones the Slurm page of the documentation gives (``scrapy queue
status NAME`` and ``python -m ... --queue NAME``), read from the page itself, so that
this test follows them wherever the modules live.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests import launcher
from tests.conftest import ROOT, crawl_env, kill_group, write_urls
from tests.events import wait_until
from tests.servers import free_port

README = (ROOT / "docs" / "how-to" / "slurm.md").read_text()


def readme_module(pattern: str) -> str:
    """The module of the Slurm page's ``python -m MODULE <pattern>`` command."""
    found = re.search(rf"python -m (\S+) {re.escape(pattern)}", README)
    assert found, f"docs/how-to/slurm.md no longer shows `python -m ... {pattern}`"
    return found.group(1)


assert "scrapy queue status NAME" in README and "scrapy queue load NAME URLS" in README
TASK_MODULE = readme_module("--queue NAME")


def queue_env(hub_url: str) -> dict:
    return {**crawl_env(), "HUB_URL": hub_url}


def queue_command(hub_url: str, *args: str) -> str:
    done = launcher.run([sys.executable, "-m", "scrapy", "queue", *args], cwd=ROOT,
                          env=queue_env(hub_url), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def status(hub_url: str, name: str) -> str:
    return queue_command(hub_url, "status", name).strip().splitlines()[-1]


def shipped_urls(data: Path) -> list[str]:
    urls = []
    for db in sorted((data / "catalogs").glob("*.db")):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            urls += [url for (url,) in conn.execute("SELECT url FROM artifacts")]
        finally:
            conn.close()
    return urls


def test_a_queue_task_on_a_sqlite_hub_and_its_status(site, tmp_path):
    hub_url = f"sqlite:///{tmp_path}/hub.db"
    base = site.base_url
    urls = [f"{base}/page/{n}.html" for n in range(290, 302)]
    urls[2] = f"{base}/hold/page/292.html"  # in the first batch, held until the test says
    url_file = write_urls(tmp_path / "urls.txt", [*urls, urls[0]])  # a duplicate, queued once
    loaded = queue_command(hub_url, "load", "local", str(url_file))
    assert "12 URLs added" in loaded
    assert status(hub_url, "local") == (
        "queue 'local': done 0/12 (0.0%), leased 0 by 0 holders, expired 0, pending 12"
    )

    data, stage = tmp_path / "data", tmp_path / "stage"
    stage.mkdir()
    cmd = [sys.executable, "-m", TASK_MODULE, "--queue", "local", "--batch", "5",
           "--urls", str(url_file), "--data", str(data), "--stage", str(stage),
           "--task", "0", "--tasks", "1", "--ship-every", "0.05",
           "--", "-s", "AUTOTHROTTLE_ENABLED=0"]  # fmt: skip
    site.reset_counts()
    site.hold()
    try:
        with open(tmp_path / "task.log", "w") as log:
            task = subprocess.Popen(cmd, cwd=ROOT, env=queue_env(hub_url), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            wait_until(lambda: site.counts["/hold/page/292.html"], "the held request", proc=task)
            # The first batch is leased and not done: it is done once crawled and shipped.
            assert status(hub_url, "local") == (
                "queue 'local': done 0/12 (0.0%), leased 5 by 1 holders, expired 0, pending 7"
            )
        finally:
            site.release()
        code = task.wait(timeout=300)
    finally:
        kill_group(task)
    assert code == 0, (tmp_path / "task.log").read_text()[-3000:]
    assert status(hub_url, "local") == (
        "queue 'local': done 12/12 (100.0%), leased 0 by 0 holders, expired 0, pending 0"
    )
    assert sorted(shipped_urls(data)) == sorted(urls)
    assert all(site.counts[u.split(base, 1)[1]] == 1 for u in urls)


def test_urls_that_fail_are_counted_failed_in_queue_stats(site, tmp_path):
    hub_url = f"sqlite:///{tmp_path}/hub.db"
    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens: every attempt refused
    good = [f"{site.base_url}/page/{n}.html" for n in range(310, 316)]
    bad = [f"{refused}/gone/{n}" for n in range(3)]
    url_file = write_urls(tmp_path / "urls.txt", [*good[:3], *bad, *good[3:]])
    queue_command(hub_url, "load", "failing", str(url_file))
    data, stage = tmp_path / "data", tmp_path / "stage"
    stage.mkdir()
    cmd = [sys.executable, "-m", TASK_MODULE, "--queue", "failing", "--batch", "4",
           "--urls", str(url_file), "--data", str(data), "--stage", str(stage),
           "--task", "0", "--tasks", "1", "--ship-every", "0.05",
           "--", "-s", "AUTOTHROTTLE_ENABLED=0", "-s", "RETRY_TIMES=1"]  # fmt: skip
    with open(tmp_path / "task.log", "w") as log:
        task = subprocess.Popen(cmd, cwd=ROOT, env=queue_env(hub_url), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        code = task.wait(timeout=300)
    finally:
        kill_group(task)
    assert code == 0, (tmp_path / "task.log").read_text()[-3000:]
    stats = queue_command(hub_url, "stats", "failing")
    # Each failing URL went back to the queue and was tried again, WORK_MAX_ATTEMPTS (3)
    # times in all; then it is kept as failed until `scrapy queue requeue`.
    assert (
        "URLs: 9 total, 0 pending, 0 leased, 0 under expired leases, 6 done, 3 failed for good "
        "(9 failed attempts put back or kept)"
    ) in stats, stats
