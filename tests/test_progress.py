"""The progress lines and the end summary the documentation shows, checked number by number."""

from __future__ import annotations

import logging
import re
import sqlite3
from urllib.parse import urlsplit

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.conftest import start_crawl, write_urls
from tests.crawls import crawl_site
from tests.events import log_text, wait_until

PROGRESS = re.compile(
    r"Progress: list (?P<done>[\d,]+)/(?P<total>[\d,]+) \((?P<pct>[\d.]+)%\), "
    r"(?P<rate>[\d.]+) pages/s, (?P<hits>[\d,]+) cache hits, (?P<errors>[\d,]+) errors, "
    r"(?P<retries>[\d,]+) retries, ETA (?P<eta>\d+:\d\d:\d\d|\?)$",
    re.MULTILINE,
)


@deferred_f_from_coro_f
async def test_progress_lines_count_the_list_hits_errors_and_retries(site, tmp_path, data_dir):
    base = site.base_url
    stored = [f"{base}/page/{n}.html" for n in (140, 141, 142)]
    await crawl_site(stored, data_dir)
    # The lines are read from a crawl process's log, as a user sees them.
    # 3 cache hits; error/: 2 retries then an error; flaky/: a retry then a page;
    # 3 more pages (one a 404), and one held in flight until the line was seen.
    held = f"{base}/hold/page/146.html"
    urls = [*stored, f"{base}/error/14", f"{base}/flaky/143", f"{base}/page/144.html"]
    urls += [f"{base}/missing/145", held]
    site.reset_counts()
    site.hold()
    log = tmp_path / "crawl.log"
    try:
        proc = start_crawl(
            write_urls(tmp_path / "urls.txt", urls), data_dir, "-s", "PROGRESS_INTERVAL=0.2",
            log_path=log,
        )  # fmt: skip
        line = wait_until(
            lambda: [m for m in PROGRESS.finditer(log_text(log)) if m["done"] == "7"],
            "a progress line with everything done but the held page",
            proc=proc,
        )[0]
    finally:
        site.release()
    assert proc.wait(timeout=120) == 0, log_text(log)[-3000:]
    assert (line["done"], line["total"], line["pct"]) == ("7", "8", "87.5")
    assert (line["hits"], line["errors"], line["retries"]) == ("3", "1", "3")
    assert float(line["rate"]) >= 0
    lines = PROGRESS.findall(log_text(log))
    assert all(total == "8" for _, total, *_ in lines)
    assert [int(done) for done, *_ in lines] == sorted(int(done) for done, *_ in lines)


@pytest.mark.parametrize(
    "archive_format",
    ["warc", "zip", "sqlite"],
)
@deferred_f_from_coro_f
async def test_the_end_summary_says_what_this_run_stored_and_what_the_catalog_holds(
    site, data_dir, archive_format, caplog
):
    caplog.set_level(logging.INFO)
    base = site.base_url
    fmt = {"ARCHIVE_FORMAT": archive_format}
    first = [f"{base}/page/{n}.html" for n in (150, 151)]
    await crawl_site(first, data_dir, fmt)
    new = [f"{base}/page/152.html", f"{base}/binary/153", f"{base}/missing/154"]
    caplog.clear()
    await crawl_site(first + new, data_dir, fmt)
    log = caplog.text

    stored_bytes = sum(len(site.payload(urlsplit(u).path)) for u in new)
    assert f"This run stored 3 responses ({stored_bytes:,} bytes) and refreshed 0." in log
    db = data_dir / "metadata.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows, total = conn.execute("SELECT count(*), sum(bytes) FROM artifacts").fetchone()
        by_status = conn.execute(
            "SELECT status, count(*) FROM artifacts GROUP BY status ORDER BY status"
        ).fetchall()
    finally:
        conn.close()
    statuses = ", ".join(f"{s}: {n}" for s, n in by_status)
    assert (rows, statuses) == (5, "200: 4, 404: 1")
    assert f"Catalog {db}: {rows} rows ({statuses}), {total:,} bytes of bodies." in log
    suffix = {"warc": ".warc.gz", "zip": ".zip", "sqlite": ".sqlite"}[archive_format]
    archives = sorted((data_dir / "archive").glob(f"*{suffix}"))
    size = sum(p.stat().st_size for p in archives)
    assert len(archives) == 2  # one per run
    assert (
        f"Archive {data_dir / 'archive'}: {size / 1e6:.1f} MB in 2 files. "
        f"Action log: {data_dir / 'fetch_log.jsonl'}"
    ) in log

    caplog.clear()
    await crawl_site(first, data_dir, fmt, revalidate="1")
    assert "This run stored 0 responses (0 bytes) and refreshed 2." in caplog.text
