"""``slurm/submit --procs P``: P crawl processes per task, each with its own shard,
archive and catalog, and ``--cpus-per-task`` set to match. The test site is one host:
``--partition-by url`` splits its URLs by key."""

from __future__ import annotations

import sqlite3

from tests.checks import assert_rows_readable, rows_by_url
from tests.conftest import write_urls
from tests.slurm_cluster import slurm_cluster  # noqa: F401 - the session fixture
from tests.slurm_jobs import logs, served, submit

PROCS = 3


def catalog_rows(db) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT key, url, archive FROM artifacts").fetchall()
    finally:
        conn.close()


def test_procs_crawl_disjoint_shards_into_their_own_archives(slurm_cluster, site, tmp_path):  # noqa: F811
    urls = [f"{site.base_url}/page/{n}.html" for n in range(260, 290)]
    data = tmp_path / "data"
    site.reset_counts()
    array, merge = submit(slurm_cluster, write_urls(tmp_path / "urls.txt", urls), data, 1,
                          tmp_path, procs=PROCS, partition="url")  # fmt: skip
    assert slurm_cluster.wait_done(array, timeout=150) == ["COMPLETED"], logs(data)
    assert slurm_cluster.job_field(f"{array}_0", "CPUs/Task") == str(PROCS)
    shards = {}
    for k in range(PROCS):
        name = f"{array}_0_r0_p{k}"
        rows = catalog_rows(data / "catalogs" / f"{name}.db")
        assert rows, f"process {k} crawled nothing"
        assert (data / "logs" / f"{name}.log").exists()
        # Its own archive files, and its own shard of the keys.
        assert all(archive.startswith(f"archive/{name}-") for _, _, archive in rows), rows
        assert {int(key, 16) % PROCS for key, _, _ in rows} == {k}
        shards[k] = {url for _, url, _ in rows}
    assert sum(len(s) for s in shards.values()) == len(urls)
    assert set().union(*shards.values()) == set(urls)
    assert set(served(site, urls).values()) == {1}
    assert slurm_cluster.wait_done(merge, timeout=90) == ["COMPLETED"], logs(data)
    assert set(rows_by_url(data)) == set(urls)
    assert_rows_readable(data, site)
