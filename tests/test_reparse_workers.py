"""What re-parse workers hand over, and ``--follow``'s batches handed to them ahead."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import shutil
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import scrapy
from itemadapter import ItemAdapter

from crawler.itemrows import item_row
from crawler.reparse import follow, runner
from crawler.reparse.follow import Follow
from crawler.reparse.plan import MIN_TASK_ROWS, ReparseConfig, plan
from crawler.reparse.runner import plain
from crawler.storage.items import PageItems
from tests.conftest import run_crawl, write_urls
from tests.polling import wait_until


class Part(scrapy.Item):
    name = scrapy.Field()
    tags = scrapy.Field()


@dataclass
class Offer:
    price: float
    parts: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def test_plain_gives_what_itemadapter_asdict_gives():
    offer = Offer(
        price=1.5,
        parts=[Part(name="a", tags=("x", "y")), {"nested": Part(name="b", tags={"z"})}],
        extra={"part": Part(name="c", tags=[1, None, b"raw"]), "n": 3, "ok": True},
    )
    assert plain(offer) == ItemAdapter(offer).asdict()
    got = plain(offer)
    assert type(got["parts"][0]) is dict and type(got["parts"][0]["tags"]) is tuple
    assert type(got["extra"]["part"]) is dict


def test_a_workers_pages_cross_to_the_parent_as_runs_of_value_tuples():
    items = [Offer(1.5, ["a"], {"b": 2}), Offer(2.0), Part(name="p", tags=["x"])]
    rows = [item_row(item, "shop") for item in items]
    page = PageItems("k" * 64, "shop", rows, "2026-01-01T00:00:00.000000Z", replace=True)
    wire = pickle.dumps(page)
    # No row dataclass in it: a class and a dict of names per item.
    assert b"ItemRow" not in wire
    back = pickle.loads(wire)
    assert back.to_wire() == page.to_wire() and back.count == 3
    assert back.runs[0][4] == [(1.5, '["a"]', '{"b": 2}'), (2.0, "[]", "{}")]


def catalog_rows(n: int) -> list:
    """``n`` catalog rows of one archive file, in offset order."""
    return [
        SimpleNamespace(
            archive="archive/a.warc.gz",
            key=f"{i:064x}",
            url=f"http://a.test/{i}",
            final_url=f"http://a.test/{i}",
            method="GET",
            fetched_at="2026-01-01T00:00:00Z",
            offset=i * 1000,
            length=1000,
            status=200,
            payload_digest=None,
        )
        for i in range(n)
    ]


def test_several_workers_get_smaller_tasks_as_the_records_run_out():
    rows = catalog_rows(3000)
    tasks = list(plan(rows, Path("data"), 200, workers=2, total=len(rows)))
    assert [key for task in tasks for key, *_ in task.rows] == [row.key for row in rows]
    sizes = [len(task.rows) for task in tasks]
    assert sizes[0] == 200 and sizes == sorted(sizes, reverse=True)
    # A worker that is done first waits for the other's last task only: a few records.
    assert sizes[-2] == MIN_TASK_ROWS and sizes[-1] <= MIN_TASK_ROWS
    assert len(tasks) <= 4 * len(rows) // 200  # not many more reads and messages
    # One worker: every task as large as allowed.
    alone = [len(task.rows) for task in plan(rows, Path("data"), 200, workers=1, total=3000)]
    assert alone == [200] * 15


PAGES = [f"page/{n}.html" for n in range(300, 311)]


@pytest.fixture(scope="module")
def logged(site, tmp_path_factory):
    """A crawl's data directory: its page log numbers every page it stored."""
    root = tmp_path_factory.mktemp("follow-batches")
    urls = write_urls(root / "urls.txt", [f"{site.base_url}/{p}" for p in PAGES])
    result = run_crawl(urls, root / "data")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "data"


@pytest.fixture
def own_signals():
    """Follow.run takes SIGINT and SIGTERM; give them back to the test run."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def progress(data_dir) -> tuple[int, int, int]:
    """(position, pages read, pages whose items are stored) of the ``site`` follower."""
    uri = f"file:{data_dir / 'metadata.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        seq, pages = conn.execute(
            "SELECT seq, pages FROM _follow_progress WHERE spider = 'site'"
        ).fetchone()
        parsed = conn.execute("SELECT count(*) FROM _item_pages WHERE _spider = 'site'")
        return seq, pages, parsed.fetchone()[0]


class StopsAfterOneBatch(Follow):
    """Stopped (as by SIGTERM) once its first batch is parsed, the next one in flight."""

    def _collect(self, results, summary):
        pages = super()._collect(results, summary)
        self.stop()
        return pages


@pytest.mark.parametrize("workers", [1, 2])
def test_follow_writes_each_batch_once_with_the_next_one_in_flight(
    logged, tmp_path, monkeypatch, own_signals, workers
):
    data_dir = shutil.copytree(logged, tmp_path / "data")
    with contextlib.closing(sqlite3.connect(data_dir / "metadata.db")) as conn:
        last, count = conn.execute("SELECT max(seq), count(*) FROM _page_log").fetchone()
    assert count == len(PAGES)
    monkeypatch.setattr(follow, "BATCH_PAGES", 4)
    config = ReparseConfig(spider="site", data_dir=data_dir, workers=workers)

    first = StopsAfterOneBatch(config, until_idle=0, poll=0.05).run()
    # The second batch was parsed, or being parsed, when it stopped: not written.
    assert (first.pages, first.batches) == (4, 1)
    seq, pages, _ = progress(data_dir)
    assert pages == 4 and seq < last

    rest = Follow(config, until_idle=0, poll=0.05).run()
    assert rest.pages == len(PAGES) - 4 and rest.batches == 2
    assert not rest.problems
    assert progress(data_dir) == (last, len(PAGES), len(PAGES))
    again = Follow(config, until_idle=0, poll=0.05).run()
    assert again.pages == 0


def _mark_then_sleep(marker):
    open(marker, "w").close()
    time.sleep(600)


def test_a_worker_that_outlives_terminate_is_killed(monkeypatch, tmp_path):
    # A worker that does not act on SIGTERM: as one still holding its parent's handler
    # (which only logs it) when the pool is terminated, before its initializer ran.
    monkeypatch.setattr(runner, "TERMINATE_WAIT", 1.0)
    pool = multiprocessing.get_context("fork").Pool(
        1, initializer=signal.signal, initargs=(signal.SIGTERM, signal.SIG_IGN)
    )
    assert pool.apply(os.getpid) != os.getpid()  # the worker is up, ignoring SIGTERM
    marker = tmp_path / "running"
    pool.apply_async(_mark_then_sleep, (str(marker),))  # and busy: it reads no "no more work"
    # A task still queued when the pool ends is drained by terminate and the idle
    # worker exits on its own: wait until the worker holds it.
    wait_until(marker.exists, "the worker to start its task")
    workers = list(pool._pool)
    ending = threading.Thread(target=runner.end_pool, args=(pool, False), daemon=True)
    ending.start()
    ending.join(timeout=60)
    assert not ending.is_alive(), "the parent waited for a worker that ignores SIGTERM"
    assert [w.exitcode for w in workers] == [-signal.SIGKILL]


def test_a_pool_whose_result_queue_lock_a_dead_worker_holds_is_left(monkeypatch):
    # A worker ended by terminate while it handed over a result leaves the result
    # queue's lock taken: the pool's task thread then waits for it forever.
    monkeypatch.setattr(runner, "TERMINATE_WAIT", 1.0)
    pool = multiprocessing.get_context("fork").Pool(1)
    assert pool.apply(os.getpid) != os.getpid()
    held = pool._outqueue._wlock
    held.acquire()
    try:
        ending = threading.Thread(target=runner.end_pool, args=(pool, False), daemon=True)
        ending.start()
        ending.join(timeout=60)
        assert not ending.is_alive(), "the parent waited for the pool's threads"
    finally:
        held.release()  # and they end
