"""The temporary files of a killed ``scrapy catalog merge -o`` are removed by the next
run of that command (real kills, mid-merge)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys

from crawler.storage.records import Row
from crawler.tools.rebuild import write_catalog
from tests.cmdline import run_scrapy
from tests.conftest import ROOT, crawl_env
from tests.polling import wait_until

ROWS = 150_000


def big_catalog(path, prefix: str) -> None:
    """A catalog of ROWS rows: one written by the project, the rest copied in SQL."""
    row = Row(f"{prefix}{0:063x}", "http://e.org/0", "http://e.org/0", 200, "text/html", 1,
              None, None, "2026-01-01T00:00:00Z", "archive/x.warc.gz", 0, 1, None)  # fmt: skip
    write_catalog([row], path)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            "INSERT INTO artifacts SELECT ? || printf('%063x', i), url, final_url, status, "
            "content_type, bytes, etag, last_modified, fetched_at, archive, i, length, "
            "payload_digest, method, rendered FROM n, artifacts",
            (ROWS - 1, prefix),
        )


def leftovers(out) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-"))


def test_the_next_merge_removes_what_a_killed_one_left(tmp_path):
    inputs = [tmp_path / "a.db", tmp_path / "b.db"]
    for path, prefix in zip(inputs, "ab", strict=True):
        big_catalog(path, prefix)
    out = tmp_path / "out.db"
    command = [
        sys.executable,
        "-m",
        "scrapy",
        "catalog",
        "merge",
        *map(str, inputs),
        "-o",
        str(out),
    ]
    for _ in range(2):
        merge = subprocess.Popen(
            command, cwd=ROOT, env=crawl_env(), start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        tmp = tmp_path / f".{out.name}.tmp-{merge.pid}"
        wait_until(
            lambda tmp=tmp: tmp.exists() and tmp.stat().st_size > 1 << 20,
            "the merge to write its temporary catalog",
            proc=merge,
        )
        os.killpg(merge.pid, signal.SIGKILL)
        merge.wait(timeout=60)
        # Its files stay; those of the run killed before it are gone.
        left = leftovers(out)
        assert {int(name.split("-")[1]) for name in left} == {merge.pid}, left
        assert any(name.endswith("-wal") for name in left), left
    assert not out.exists()
    # A merge running now (this process stands for it): its file is not touched.
    running = tmp_path / f".{out.name}.tmp-{os.getpid()}"
    running.write_bytes(b"in use")

    result = run_scrapy(*command[3:])
    assert result.returncode == 0, result.stderr[-3000:]
    assert leftovers(out) == [running.name]
    with contextlib.closing(sqlite3.connect(f"file:{out}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT count(*) FROM artifacts").fetchone() == (2 * ROWS,)
