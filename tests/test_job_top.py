"""``scrapy job top`` over real crawl processes of a job, on a SQLite hub and on a
PostgreSQL one: every process listed with its rate, which the action logs bear out; a
killed process dead within three heartbeats, with its log named; a process whose only
proxy is banned waiting for a proxy; a terminal redrawn in place; bad input."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from crawler.hub import Hub, ProxyPool
from crawler.hub.heartbeats import Beat, HeartbeatStore
from crawler.hub.jobs import JobStore
from tests import launcher
from tests.conftest import ROOT, crawl_command, crawl_env, kill_group, write_urls
from tests.hubs import hub_url, scrapy_with_hub  # noqa: F401 - hub_url: a fixture
from tests.jobwatch import PERIOD, process_rows, start_crawls, stop, top
from tests.polling import wait_until
from tests.proxy_servers import PROXY_PASSWORD, PROXY_USER, TinyProxy
from tests.servers import need

RATE_WINDOW = 30.0  # crawler.hub.heartbeats.RATE_SECONDS


def pages_logged(data: Path, since: float, until: float) -> int:
    """Pages the action log says were fetched between the two epoch times."""
    count = 0
    for line in (data / "fetch_log.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["outcome"] not in ("ok", "not_modified", "unchanged"):
            continue
        ts = datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
        count += since < ts <= until
    return count


def test_top_shows_every_process_its_rate_and_a_killed_one_dead(hub_url, site, tmp_path):  # noqa: F811
    with Hub.open(hub_url) as hub:
        JobStore(hub).create("watch", "site", {})
    crawls = start_crawls(hub_url, site, tmp_path, 4)
    try:
        pids = {c["proc"].pid for c in crawls}
        wait_until(
            lambda: set(process_rows(top(hub_url, "watch").stdout)) == pids,
            "the 4 processes to report",
            proc=crawls[0]["proc"],
        )
        # Each process's rate window full: what it says is over the last 30 s.
        time.sleep(RATE_WINDOW + 2 * PERIOD)
        before = time.time()
        shown = top(hub_url, "watch")
        read_at = (before + time.time()) / 2
        rows = process_rows(shown.stdout)
        assert set(rows) == pids, shown.stdout
        assert shown.stdout.splitlines()[1] == "4 processes: 4 fetching", shown.stdout
        time.sleep(6)  # the last of those pages committed: their ok lines written
        for crawl in crawls:
            row = rows[crawl["proc"].pid]
            logged = pages_logged(crawl["data"], read_at - RATE_WINDOW, read_at) / RATE_WINDOW
            said = float(row["pages/s"])
            assert logged > 1, f"a steady crawl: {logged:.2f} pages/s"
            assert abs(said - logged) <= 0.2 * logged, (said, logged, shown.stdout)

        victim = crawls[0]
        kill_group(victim["proc"])  # the whole process tree, as a node failure
        killed = time.monotonic()
        dead = wait_until(
            lambda: (
                (r := process_rows(top(hub_url, "watch").stdout))
                .get(victim["proc"].pid, {})
                .get("state")
                == "dead"
                and r
            ),
            "the killed process to show dead",
            timeout=60,
        )
        # Dead once three periods passed since its last beat, which came before the kill;
        # the slack is the time one `job top` takes on a loaded machine.
        assert time.monotonic() - killed <= 3 * PERIOD + 4
        assert [r["state"] for pid, r in dead.items() if pid != victim["proc"].pid] == [
            "fetching"
        ] * 3
        listing = top(hub_url, "watch", "--state", "problems").stdout
        assert set(process_rows(listing)) == {victim["proc"].pid}
        problem = [line for line in listing.splitlines() if line.startswith("DEAD: ")]
        assert len(problem) == 1 and f"read {os.uname().nodename}:{victim['log']}" in problem[0], (
            listing
        )

        # A graceful stop: the process says it finished, and is not dead.
        stopped = crawls[1]
        stopped["proc"].send_signal(signal.SIGTERM)
        assert stopped["proc"].wait(timeout=120) in (0, 75)
        finished = process_rows(top(hub_url, "watch").stdout)[stopped["proc"].pid]
        assert finished["state"] == "finished" and "finished (shutdown)" in finished["why"]
    finally:
        stop(crawls)
    with Hub.open(hub_url) as hub:
        rows = HeartbeatStore(hub).read("watch")
    assert len(rows) == 4, "one row per process, updated in place"


def test_a_process_whose_only_proxy_is_banned_waits_for_a_proxy(hub_url, site, tmp_path):  # noqa: F811
    if shutil.which("tinyproxy") is None:
        need("tinyproxy is not installed (Debian: apt-get install tinyproxy)")
    # It answers 403 to every request: a ban (PROXY_BAN_STATUSES), resting an hour.
    proxy = TinyProxy("banning", tmp_path, auth=(PROXY_USER, PROXY_PASSWORD), deny_all=True)
    proxy.start()
    crawls = []
    try:
        with Hub.open(hub_url) as hub:
            ProxyPool(hub).add([proxy.url])
            JobStore(hub).create("watch", "site", {})
        crawls = start_crawls(
            hub_url, site, tmp_path, 1, "-s", "PROXY_BAN_REST_SECONDS=3600",
            "-s", "PROXY_LEASES_PER_PROCESS=1", "-s", "PROXY_POLL_SECONDS=0.5",
        )  # fmt: skip
        pid = crawls[0]["proc"].pid

        def waiting() -> str | None:
            text = top(hub_url, "watch").stdout
            return (
                text
                if process_rows(text).get(pid, {}).get("state") == "waiting for a proxy"
                else None
            )

        text = wait_until(
            waiting, "the process to wait for a proxy", timeout=90, proc=crawls[0]["proc"]
        )
        assert "requests wait for a proxy lease" in process_rows(text)[pid]["why"]
        banned = f"http://{PROXY_USER}:***@127.0.0.1:{proxy.port}"

        def listed_banned() -> str | None:
            text = top(hub_url, "watch").stdout
            return text if f"{banned}  banned" in text else None

        listed = wait_until(
            listed_banned, "the proxy listed as banned by the job's process", timeout=60
        )
        assert PROXY_PASSWORD not in listed
    finally:
        stop(crawls)
        proxy.stop()


def test_a_process_whose_pages_never_come_shows_stalled(site, tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    with Hub.open(hub) as opened:
        JobStore(opened).create("watch", "site", {})
    urls = write_urls(
        tmp_path / "urls.txt", [f"{site.base_url}/hold/page/{n}.html" for n in range(20)]
    )
    site.hold()  # every page is held: requests on the wire, nothing comes back
    log = tmp_path / "crawl.log"
    command = crawl_command(
        urls, tmp_path / "data", "-s", f"HUB_URL={hub}", "-s", "JOB=watch",
        "-s", "ROBOTSTXT_OBEY=0", "-s", "CONCURRENT_REQUESTS=2", "-s", "HEARTBEAT_SECONDS=1",
    )  # fmt: skip
    proc = launcher.start(command, log=log, cwd=ROOT, env=crawl_env(), new_session=True)
    try:

        def stalled() -> str | None:
            text = top(hub, "watch").stdout
            return text if process_rows(text).get(proc.pid, {}).get("state") == "stalled" else None

        text = wait_until(stalled, "the process to show stalled", timeout=120, proc=proc)
    finally:
        site.release()
        kill_group(proc)
    problem = [line for line in text.splitlines() if line.startswith("STALLED: ")]
    assert len(problem) == 1, text
    assert "0 pages/s over 30 s with" in problem[0] and f":{log}" in problem[0]


def test_the_storage_lag_and_the_last_error_of_a_process(site, tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    urls = [f"{site.base_url}/page/{n}.html" for n in range(20)]
    urls.append(f"{site.base_url}/error/7")  # a 500 every time: retried, then an error
    urls.append(f"{site.base_url}/hold/page/20.html")  # keeps the crawl running
    listed = write_urls(tmp_path / "urls.txt", urls)
    site.hold()
    # No commit while it runs: every row stored is a row of lag.
    command = crawl_command(
        listed, tmp_path / "data", "-s", f"HUB_URL={hub}", "-s", "ROBOTSTXT_OBEY=0",
        "-s", "HEARTBEAT_SECONDS=1", "-s", "CATALOG_FLUSH_SECONDS=3600",
        "-s", "CATALOG_BATCH_SIZE=100000",
    )  # fmt: skip
    proc = launcher.start(command, log=tmp_path / "crawl.log", cwd=ROOT, env=crawl_env())
    try:

        def twenty() -> dict | None:
            row = process_rows(top(hub).stdout).get(proc.pid, {})
            return row if row.get("pages") == "20" and row.get("errors") == "1" else None

        row = wait_until(twenty, "the 20 pages stored and the error", proc=proc)
        assert row["lag"] == "20", row
        assert row["last error"].endswith(f"UTC HTTP 500: {site.base_url}/error/7"), row
    finally:
        site.release()
    assert proc.wait(timeout=120) == 0
    finished = process_rows(top(hub).stdout)[proc.pid]
    assert (finished["state"], finished["pages"], finished["lag"]) == ("finished", "21", "0")


def test_an_unknown_job_exits_2_with_one_line(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    with Hub.open(hub) as opened:
        JobStore(opened).create("real", "site", {})
    for args in (("top", "nope"), ("serve", "nope", "--port", "0")):
        done = scrapy_with_hub("job", *args, hub=hub)
        assert done.returncode == 2, done
        assert done.stderr.splitlines() == [
            f"error: no job 'nope' in the hub {hub}: `scrapy job list` shows the jobs "
            "(without a NAME, `scrapy job top` shows every process)"
        ]
    for bad, said in (
        (("top", "real", "--sort", "speed"), "--sort 'speed'"),
        (("top", "real", "--state", "asleep"), "--state 'asleep'"),
        (("top", "a", "b"), "one job NAME at most"),
        (("top", "real", "--interval", "0"), "--interval"),
        (("serve", "real", "--bind", "0.0.0.0"), "--token"),
    ):
        done = scrapy_with_hub("job", *bad, hub=hub)
        assert done.returncode == 2 and said in done.stderr, (bad, done.stderr)
        assert "Traceback" not in done.stderr
    # A known job no process reported yet: said, exit 0.
    done = scrapy_with_hub("job", "top", "real", hub=hub)
    assert done.returncode == 0 and "no crawl process of job 'real' has reported" in done.stdout


def test_top_in_a_terminal_redraws_in_place_and_takes_keys(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    with Hub.open(hub) as opened:
        store = HeartbeatStore(opened)
        # By state, zeta (fetching) comes first; by node, alpha (idle).
        for pid, node, state in ((101, "zeta", "fetching"), (102, "alpha", "idle")):
            store.write(Beat(id=f"{node}/{pid}", node=node, pid=pid, period=3600.0, state=state))
    master, slave = pty.openpty()
    import fcntl
    import termios

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {**crawl_env(), "HUB_URL": hub, "TERM": "xterm-256color", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy", "job", "top", "--interval", "0.3"],
        stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, count: int = 1) -> None:
        nonlocal seen
        deadline = time.monotonic() + 60
        while seen.count(marker) < count:
            assert time.monotonic() < deadline, seen.decode(errors="replace")[-3000:]
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break

    try:
        read_until(b"sorted by state", 2)  # drawn, then drawn again
        assert b"\x1b[2K" in seen or b"\x1b[1A" in seen, "redrawn in place, not appended"
        assert b"s: next sort" in seen
        os.write(master, b"s")
        read_until(b"sorted by node")
        os.write(master, b"q")
        assert proc.wait(timeout=30) == 0
        while select.select([master], [], [], 0.2)[0]:  # the rest of the last drawing
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child's end is closed: all is read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = seen.decode(errors="replace")
    before = text[text.index("sorted by state") : text.index("sorted by node")]
    assert before.index("zeta") < before.index("alpha"), "sorted by state"
    after = text[text.rindex("sorted by node") :]
    assert after.index("alpha") < after.index("zeta"), "sorted by node"
