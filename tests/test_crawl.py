"""The ``site`` spider end to end: real server, real crawls, real files.

Crawls run in process (tests/crawls.py) but where the process is the point: standard
input, a usage error's exit status, ``runspider``, a refused second crawl."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections import Counter
from urllib.parse import urljoin, urlsplit

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from warcio.archiveiterator import ArchiveIterator

from crawler.storage.keys import request_key
from tests import launcher
from tests.checks import actions, assert_rows_readable, catalog_rows, rows_by_url
from tests.conftest import ROOT, crawl_env, run_crawl, write_urls
from tests.crawls import crawl_site, crawled
from tests.rawserver import RawServer, response

KINDS = ["page/1.html", "gzip/2", "chunked/3", "redirect/4", "binary/5", "latin1/6"]


@pytest.fixture(scope="module")
def kinds(site, tmp_path_factory):
    """A data directory holding one page of each kind the site serves."""
    data_dir = tmp_path_factory.mktemp("kinds") / "data"
    crawler = crawled(crawl_site([f"{site.base_url}/{k}" for k in KINDS], data_dir))
    assert crawler.stats.get_value("finish_reason") == "finished"
    return data_dir


def test_bytes_stored_equal_bytes_served(site, kinds):
    data_dir = kinds
    urls = [f"{site.base_url}/{k}" for k in KINDS]
    rows = assert_rows_readable(data_dir, site)
    by_url = rows_by_url(data_dir)
    assert set(by_url) == set(urls)
    redirected = by_url[f"{site.base_url}/redirect/4"]
    assert redirected.final_url == f"{site.base_url}/page/4.html"
    assert redirected.key == request_key(f"{site.base_url}/redirect/4")
    assert by_url[f"{site.base_url}/latin1/6"].content_type == "text/html; charset=iso-8859-1"
    assert all(r.fetched_at.endswith("Z") and "T" in r.fetched_at for r in rows.values())
    assert all(
        r.archive.startswith("archive/") and r.archive.endswith(".warc.gz") for r in rows.values()
    )


@deferred_f_from_coro_f
async def test_stored_headers_describe_the_stored_payload(site, data_dir):
    urls = [f"{site.base_url}/gzip/7", f"{site.base_url}/chunked/7"]
    await crawl_site(urls, data_dir)
    checked = []
    for path in (data_dir / "archive").glob("*.warc.gz"):
        with open(path, "rb") as f:
            for record in ArchiveIterator(f):
                if record.rec_type != "response":
                    continue
                headers = record.http_headers
                body = record.content_stream().read()
                assert headers.get_header("Content-Encoding") is None
                assert headers.get_header("Transfer-Encoding") is None
                assert int(headers.get_header("Content-Length")) == len(body)
                uri = record.rec_headers.get_header("WARC-Target-URI")
                assert body == site.payload(uri.split(site.base_url)[1])
                checked.append(uri)
    assert sorted(checked) == sorted(urls)


def test_archive_passes_warcio_check_and_cdxj_indexer(kinds):
    archives = sorted((kinds / "archive").glob("*.warc.gz"))
    assert archives
    bindir = ROOT / ".venv" / "bin"
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "from warcio.cli import main; main()",
            "check",
            "-v",
            *map(str, archives),
        ],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    indexer = bindir / "cdxj-indexer"
    cdx = subprocess.run([str(indexer), *map(str, archives)], capture_output=True, text=True)
    assert cdx.returncode == 0, cdx.stderr
    lines = [line for line in cdx.stdout.splitlines() if '"status": "200"' in line]
    assert len(lines) >= len(KINDS)


@deferred_f_from_coro_f
async def test_statuses_rows_and_action_log(site, data_dir, caplog):
    base = site.base_url
    urls = [
        f"{base}/missing/1",
        f"{base}/gone/1",
        f"{base}/error/1",
        f"{base}/private/1",
        f"{base}/flaky/9",
    ]
    caplog.set_level(logging.INFO, logger="extensions.storage")
    await crawl_site(urls, data_dir)
    by_url = rows_by_url(data_dir)
    assert by_url[f"{base}/missing/1"].status == 404
    assert by_url[f"{base}/gone/1"].status == 410
    assert by_url[f"{base}/flaky/9"].status == 200
    assert f"{base}/error/1" not in by_url  # 5xx after retries: tried again next run
    assert f"{base}/private/1" not in by_url
    log = actions(data_dir)
    for entry in log:
        assert set(entry) >= {
            "ts",
            "url",
            "key",
            "attempt",
            "outcome",
            "status",
            "error",
            "elapsed_ms",
            "bytes",
        }
    outcomes = Counter((e["url"], e["outcome"]) for e in log)
    assert outcomes[(f"{base}/error/1", "retry")] == 2
    assert outcomes[(f"{base}/error/1", "error")] == 1
    assert outcomes[(f"{base}/flaky/9", "retry")] == 1
    assert outcomes[(f"{base}/flaky/9", "ok")] == 1
    robots = [e for e in log if e["url"] == f"{base}/private/1"]
    assert robots and robots[0]["outcome"] == "error" and "robots.txt" in robots[0]["error"]
    final_error = [e for e in log if e["url"] == f"{base}/error/1" and e["outcome"] == "error"][0]
    assert final_error["status"] == 500 and final_error["attempt"] == 3
    # The console's end summary names each error's cause: robots.txt's refusal is one.
    (summary,) = [r.message for r in caplog.records if "Outcomes of this run" in r.message]
    assert "2 error (1 HTTP 500, 1 forbidden by robots.txt)," in summary, summary


@deferred_f_from_coro_f
async def test_bad_lines_are_reported_and_skipped(site, tmp_path, data_dir, caplog):
    base = site.base_url
    lines = [
        "# a comment",
        f"{base}/page/10.html",
        "",
        "not a url",
        "ftp://example.org/file",
        "http://",
        f"{base}/page/11.html",
        "http://bad port:x/",
    ]
    crawler = await crawl_site(write_urls(tmp_path / "urls.txt", lines), data_dir)
    for number in (4, 5, 6, 8):
        assert f"urls.txt:{number}:" in caplog.text
    assert caplog.text.count("Skipped line") == 4
    assert crawler.stats.get_value("site/bad_lines") == 4
    errors = [e for e in actions(data_dir) if e["outcome"] == "error" and e["key"] is None]
    assert len(errors) == 4
    assert set(rows_by_url(data_dir)) == {f"{base}/page/10.html", f"{base}/page/11.html"}


def test_missing_url_list_is_a_clear_error(tmp_path, data_dir):
    result = run_crawl(tmp_path / "nope.txt", data_dir)
    assert result.returncode == 2
    assert f"cannot read the URL list {tmp_path / 'nope.txt'}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (data_dir / "metadata.db").exists()


def test_urls_from_stdin_and_duplicates_fetched_once(site, tmp_path, data_dir):
    base = site.base_url
    url = f"{base}/page/20.html"
    site.reset_counts()
    result = run_crawl("-", data_dir, stdin=f"{url}\n{url}\n{base}/page/21.html\n{url}\n")
    assert result.returncode == 0, result.stderr
    assert site.counts["/page/20.html"] == 1
    assert set(rows_by_url(data_dir)) == {url, f"{base}/page/21.html"}


@deferred_f_from_coro_f
async def test_duplicates_are_fetched_once_when_the_filter_has_moved_to_disk(site, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(200, 230)]
    # One resume batch: every copy passes the catalog check, the filter alone decides.
    site.reset_counts()
    crawler = await crawl_site(urls * 3, data_dir, {"DUPEFILTER_MEMORY_FINGERPRINTS": 4})
    assert {p: c for p, c in site.counts.items() if p.startswith("/page/")} == {
        f"/page/{n}.html": 1 for n in range(200, 230)
    }
    assert set(rows_by_url(data_dir)) == set(urls)
    assert crawler.stats.get_value("dupefilter/filtered") == 60


@deferred_f_from_coro_f
async def test_resume_fetches_nothing_already_stored(site, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(30, 60)]
    await crawl_site(urls, data_dir)
    before = catalog_rows(data_dir)
    site.reset_counts()
    await crawl_site(urls, data_dir)
    fetched = {p: c for p, c in site.counts.items() if p.startswith("/page/")}
    assert fetched == {}
    assert catalog_rows(data_dir) == before
    hits = [e for e in actions(data_dir) if e["outcome"] == "cache_hit"]
    assert sorted(e["url"] for e in hits) == sorted(urls)


@deferred_f_from_coro_f
async def test_revalidation_sends_validators_and_handles_304_and_200(site, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in (70, 71)]
    await crawl_site(urls, data_dir)
    before = rows_by_url(data_dir)
    site.bump("/page/71.html")
    await crawl_site(urls, data_dir, revalidate="1")
    sent = site.request_headers["/page/70.html"]
    assert sent.get("If-None-Match") == before[urls[0]].etag
    assert sent.get("If-Modified-Since") == before[urls[0]].last_modified
    after = rows_by_url(data_dir)
    assert len(after) == 2
    same, changed = after[urls[0]], after[urls[1]]
    old = before[urls[0]]
    assert same.fetched_at > old.fetched_at
    assert (same.archive, same.offset, same.length, same.payload_digest) == (
        old.archive,
        old.offset,
        old.length,
        old.payload_digest,
    )
    assert changed.payload_digest != before[urls[1]].payload_digest
    assert changed.etag != before[urls[1]].etag
    assert_rows_readable(data_dir, site)
    outcomes = Counter(e["outcome"] for e in actions(data_dir) if e["url"] in urls)
    assert outcomes["not_modified"] == 1 and outcomes["ok"] == 3


def linked_within(site, start: str, depth: int) -> dict[str, int]:
    """URL -> fewest links from ``start``, up to ``depth``, reading the served pages as
    the site spider should: links on the same host (an IP is its own registered
    domain; ``localhost`` is another one), redirects followed, robots.txt obeyed."""
    found, frontier = {start: 0}, [start]
    for level in range(1, depth + 1):
        nxt = []
        for url in frontier:
            answer = site.answer(urlsplit(url).path, {}, serving=False)
            while answer.status in (301, 302):
                url = urljoin(url, answer.headers["Location"])
                answer = site.answer(urlsplit(url).path, {}, serving=False)
            for href in re.findall(r"href='([^']*)'", answer.body.decode("utf-8", "replace")):
                link = urljoin(url, href)
                if urlsplit(link).hostname == "127.0.0.1" and link not in found:
                    found[link] = level
                    nxt.append(link)
        frontier = [u for u in nxt if "/private/" not in u]
    return found


@deferred_f_from_coro_f
async def test_depth_crawl_stays_on_site_and_resumes_to_the_same_pages(site, tmp_path):
    start = f"{site.base_url}/page/100.html"
    url_file = write_urls(tmp_path / "urls.txt", [start])
    full, part = tmp_path / "full", tmp_path / "part"
    site.reset_counts()
    await crawl_site(url_file, full, depth="2")
    reached = set(rows_by_url(full))
    # Exactly the pages within two links, none on localhost, none deeper.
    within = {u for u in linked_within(site, start, 2) if "/private/" not in u}
    assert reached == within
    links = re.findall(r"href='([^']*)'", site.payload("/page/100.html").decode())
    assert [h for h in links if urlsplit(h).hostname == "localhost"], "it links off site"
    assert all(urlsplit(u).hostname == "127.0.0.1" for u in reached)
    deeper = {urlsplit(u).path for u, d in linked_within(site, start, 3).items() if d == 3}
    deeper -= {urlsplit(u).path for u in within}
    assert deeper and not {p for p in deeper if site.counts[p]}, "fetched beyond depth 2"
    stopped = await crawl_site(url_file, part, {"CLOSESPIDER_PAGECOUNT": 8}, status=75, depth="2")
    assert stopped.stats.get_value("finish_reason") == "closespider_pagecount"
    assert len(rows_by_url(part)) < len(reached)
    resumed = await crawl_site(url_file, part, depth="2")
    assert resumed.stats.get_value("finish_reason") == "finished"
    assert set(rows_by_url(part)) == reached


def test_a_users_own_spider_gets_the_same_storage(site, tmp_path, data_dir):
    spider = tmp_path / "mine.py"
    spider.write_text(
        "import scrapy\n"
        "class Mine(scrapy.Spider):\n"
        "    name = 'mine'\n"
        f"    start_urls = ['{site.base_url}/page/90.html', '{site.base_url}/gzip/91']\n"
        "    def parse(self, response):\n"
        "        yield {'url': response.url}\n"
    )
    result = launcher.run(
        [sys.executable, "-m", "scrapy", "runspider", str(spider), "-s", f"DATA_DIR={data_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=crawl_env(),
    )
    assert result.returncode == 0, result.stderr
    assert len(assert_rows_readable(data_dir, site)) == 2


def test_a_crawl_refused_the_data_dir_sends_no_request(tmp_path, data_dir):
    from crawler.storage.datadir import DataDir
    from crawler.storage.errors import StoreError

    # Its own server: every request it sees (robots.txt included) is this crawl's.
    server = RawServer({"/page/1.html": response(body=b"<html>one</html>")})
    lock = DataDir(data_dir).lock()
    lock.acquire()
    try:
        urls = write_urls(tmp_path / "u.txt", [server.url(f"/page/{n}.html") for n in range(5)])
        result = run_crawl(urls, data_dir, "-s", "LOG_QUIET=1")
    finally:
        lock.release()
        server.close()
    assert result.returncode == 1
    assert sum(server.counts.values()) == 0, server.counts
    # One line says why (no outcome summary of a run that never started), besides
    # Scrapy's own "Spider closed (storage_error)".
    said = [line for line in result.stderr.splitlines() if line.strip()]
    said = [line for line in said if "Spider closed (storage_error)" not in line]
    assert len(said) == 1 and "is in use by another crawl" in said[0], result.stderr
    with pytest.raises(StoreError):
        other = DataDir(data_dir).lock()
        lock.acquire()
        other.acquire()


BLOCK = 1 << 20  # UrlList.count() reads the list in blocks of this size


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        ("a\n\n# c\nb\n", 2),
        ("# x\na\nb", 2),
        ("\n\na\r\n\r\nb\r\n", 2),
        ("a\n" * 3, 3),
        ("", 0),
        ("\n", 0),
        ("# only a comment\n", 0),
        ("x\n" * 300_000, 300_000),
        # Lines that end, or comments that start, exactly where a block does.
        ("a" * (BLOCK - 1) + "\nb\n", 2),
        ("a" * (BLOCK - 2) + "\n#c\nb\n", 2),
        ("a" * (BLOCK - 1) + "\n#c\nb\n", 2),
        ("a" * (BLOCK - 1) + "\n\nb\n", 2),
        ("a" * BLOCK + "\n\n#c\n", 1),
        ("a" * (BLOCK - 1) + "\n" + "b" * BLOCK + "\nc", 3),
    ],
)
def test_url_list_count_equals_its_entries(tmp_path, text, entries):
    from crawler.spiderkit.urls import UrlList

    path = tmp_path / "urls.txt"
    path.write_bytes(text.encode())
    urls = UrlList(str(path))
    assert urls.count() == entries
    assert sum(1 for _ in urls) == entries  # iterating reads (and closes) the file


def test_url_list_skips_a_byte_order_mark(tmp_path):
    from crawler.spiderkit.urls import UrlList

    path = tmp_path / "urls.txt"
    path.write_bytes(b"\xef\xbb\xbfhttp://a.example/1\r\nhttp://b.example/2\r\n")
    entries = list(UrlList(str(path)))
    assert entries == [(1, "http://a.example/1", None), (2, "http://b.example/2", None)]
