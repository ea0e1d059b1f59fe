"""`scrapy reparse SPIDER --follow` beside a crawl: killed and restarted, every page once."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys

from crawler.reparse.follow import unseen
from crawler.storage.catalog import Catalog
from tests.checks import catalog_rows
from tests.conftest import ROOT, crawl_env, kill_group, start_crawl, write_urls
from tests.polling import wait_until

PAGES = 150
MODULES = ("-s", "SPIDER_MODULES=spiders,tests.item_spiders")


def follower(data_dir, log_path, *args) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "scrapy", "reparse", "items", "--follow", "--workers", "2"]
            + ["-s", f"DATA_DIR={data_dir}", *MODULES, *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=crawl_env(),
            start_new_session=True,
        )


def followed(data_dir) -> int:
    path = data_dir / "metadata.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
        try:
            got = conn.execute("SELECT pages FROM _follow_progress WHERE spider = 'items'")
        except sqlite3.OperationalError:
            return 0
        row = got.fetchone()
        return row[0] if row else 0


def test_follow_killed_and_restarted_parses_every_page_once(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/slow/{n}?ms=40" for n in range(PAGES)]
    # Held until the first kill: the crawl cannot finish first, however slowly the
    # follower starts on a loaded machine.
    urls[1] = f"{site.base_url}/hold/slow/1?ms=40"
    url_file = write_urls(tmp_path / "urls.txt", urls)
    site.hold()
    crawl = start_crawl(
        url_file,
        data_dir,
        "-a",
        "summaries=1",
        "-s",
        "CATALOG_BATCH_SIZE=5",
        "-s",
        "CONCURRENT_REQUESTS_PER_DOMAIN=4",
        log_path=tmp_path / "crawl.log",
    )
    at_kill = []
    try:
        for attempt, pages in enumerate((10, 60)):
            proc = follower(data_dir, tmp_path / f"follow{attempt}.log")
            wait_until(
                lambda p=pages: followed(data_dir) >= p, f"{pages} pages followed", proc=proc
            )
            kill_group(proc, signal.SIGKILL)
            at_kill.append(followed(data_dir))
            site.release()
        # SIGTERM: it finishes the batch in hand and exits cleanly.
        term_log = tmp_path / "follow-term.log"
        proc = follower(data_dir, term_log, "-s", "LOG_LEVEL=INFO")
        # Its handler is installed once it says where it starts (a loaded machine may
        # have let the crawl and the follower before it finish every page).
        wait_until(lambda: "Following" in term_log.read_text(), "the follower to start", proc=proc)
        wait_until(
            lambda: followed(data_dir) > at_kill[-1] or followed(data_dir) == PAGES,
            "more pages followed",
            proc=proc,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (tmp_path / "follow-term.log").read_text()[-3000:]
        last = follower(data_dir, tmp_path / "follow-last.log", "--until-idle", "1")
        assert crawl.wait(timeout=300) == 0
        assert last.wait(timeout=300) == 0, (tmp_path / "follow-last.log").read_text()[-3000:]
    finally:
        site.release()
        kill_group(crawl, signal.SIGKILL)

    print("pages followed at each kill:", at_kill)
    assert at_kill[0] < PAGES, at_kill  # killed while the crawl was still going
    rows = catalog_rows(data_dir)
    assert len(rows) == PAGES
    # Each page read once across the four followers, and its items there.
    assert followed(data_dir) == PAGES
    path = data_dir / "metadata.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        parsed = [
            k for (k,) in conn.execute("SELECT _key FROM _item_pages WHERE _spider = 'items'")
        ]
        page_items = [k for (k,) in conn.execute("SELECT _key FROM page_item")]
        summaries = conn.execute("SELECT count(*) FROM page_summary").fetchone()[0]
    assert sorted(parsed) == sorted(rows)
    assert sorted(page_items) == sorted(rows)
    assert summaries == PAGES  # the crawl's own items, beside the follower's


def shipped_followed(data) -> int:
    path = data / "derived" / "items.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
        try:
            got = conn.execute("SELECT sum(pages) FROM _follow_shipped WHERE spider = 'items'")
        except sqlite3.OperationalError:
            return 0
        return got.fetchone()[0] or 0


def start_task(urls, data, stage, task: int, tasks: int, log_path) -> subprocess.Popen:
    """One Slurm array task as slurm/crawl.sbatch runs it, without Slurm: crawls on its
    own staging directory, shipped to DATA/ every 0.6 s by the real shipping code."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "slurm.task", "--urls", str(urls), "--data", str(data)]
            + ["--stage", str(stage), "--task", str(task), "--tasks", str(tasks)]
            + ["--name", f"job_{task}_r0", "--ship-every", "0.01", "--"]
            + ["-s", "AUTOTHROTTLE_ENABLED=0", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=2"]
            + ["-s", "CATALOG_BATCH_SIZE=5", "-s", "LOG_LEVEL=INFO"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=crawl_env(),
            start_new_session=True,
        )


def test_follow_over_a_slurm_data_dir_parses_every_shipped_page_once(site, tmp_path):
    """Two tasks ship into DATA/ while the follower reads the shipped catalogs; killed
    twice, then --until-idle: each page parsed once, into DATA/derived/items.db."""
    pages = 160
    urls = [f"{site.base_url}/slow/{n}?ms=400" for n in range(pages)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    data = tmp_path / "DATA"
    tasks = [
        start_task(url_file, data, tmp_path / f"stage{i}", i, 2, tmp_path / f"task{i}.log")
        for i in range(2)
    ]
    at_kill = []
    try:
        for attempt, wanted in enumerate((10, 50)):
            proc = follower(data, tmp_path / f"follow{attempt}.log")
            wait_until(
                lambda w=wanted: shipped_followed(data) >= w, f"{wanted} pages followed", proc=proc
            )
            kill_group(proc, signal.SIGKILL)
            at_kill.append(shipped_followed(data))
        last = follower(data, tmp_path / "follow-last.log", "--until-idle", "8")
        for i, task in enumerate(tasks):
            assert task.wait(timeout=300) == 0, (tmp_path / f"task{i}.log").read_text()[-3000:]
        assert last.wait(timeout=300) == 0, (tmp_path / "follow-last.log").read_text()[-3000:]
    finally:
        for task in tasks:
            kill_group(task, signal.SIGKILL)

    print("pages followed at each kill:", at_kill)
    assert at_kill[0] < pages, at_kill  # killed while the tasks were still shipping
    shipped = []
    for catalog in sorted((data / "catalogs").glob("*.db")):
        with Catalog(catalog, readonly=True) as opened:
            shipped += [row.key for row in opened.rows()]
    assert len(shipped) == len(set(shipped)) == pages
    assert shipped_followed(data) == pages
    # Started before the first shipment, it waited for one (no catalog of its own in DATA/).
    assert not (data / "metadata.db").exists()
    path = data / "derived" / "items.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        parsed = [
            k for (k,) in conn.execute("SELECT _key FROM _item_pages WHERE _spider = 'items'")
        ]
        page_items = [k for (k,) in conn.execute("SELECT _key FROM page_item")]
    assert sorted(parsed) == sorted(shipped)
    assert sorted(page_items) == sorted(shipped)


def test_a_page_a_shipment_held_back_is_parsed_when_it_comes():
    """A shipment leaves out pages whose archive is not shipped yet (log numbers 3, 4);
    the next brings them below the position reached: they are the gaps."""
    first = [(1, "a"), (2, "b"), (5, "e"), (6, "f")]
    todo, seq, gaps = unseen(first, 0, set(), limit=3)
    assert (todo, seq, gaps) == ([(1, "a"), (2, "b"), (5, "e")], 5, {3, 4})
    todo, seq, gaps = unseen(first, seq, gaps, limit=10)
    assert (todo, seq, gaps) == ([(6, "f")], 6, {3, 4})
    second = [*first[:2], (3, "c"), *first[2:], (7, "g")]
    todo, seq, gaps = unseen(second, seq, gaps, limit=10)
    assert (todo, seq, gaps) == ([(3, "c"), (7, "g")], 7, {4})
    assert unseen(second, seq, gaps, limit=10) == ([], 7, {4})
