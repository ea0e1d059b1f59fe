"""``scrapy reparse``: stored pages parsed again, no requests, every record accounted for."""

from __future__ import annotations

import dataclasses
import gc
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest
from itemadapter import ItemAdapter
from scrapy.http import TextResponse
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.reparse.plan import ReparseConfig, ReparseError, plan, select_rows
from crawler.reparse.runner import TABLES, Progress, Reparse, Reparser, plain
from crawler.storage.catalog import Catalog
from tests.checks import catalog_rows
from tests.cmdline import canon, read_jsonl, run_scrapy
from tests.conftest import ROOT, write_urls
from tests.crawls import crawl_site
from tests.crawls import crawled as crawled_now

PATHS = [f"page/{n}.html" for n in range(200, 208)] + [
    "product/3.html",
    "product/4.html",
    "binary/7",
    "redirect/9",
    "missing/3",
]


@pytest.fixture(scope="module")
def crawled(site, tmp_path_factory):
    """A data directory crawled by the ``site`` spider, with the items it produced."""
    root = tmp_path_factory.mktemp("reparse")
    urls = [f"{site.base_url}/{p}" for p in PATHS]
    data_dir = root / "data"
    feed = {str(root / "crawl.jsonl"): {"format": "jsonl"}}  # -o crawl.jsonl
    crawled_now(crawl_site(urls, data_dir, {"FEEDS": feed}, summaries="1"))
    return data_dir, read_jsonl(root / "crawl.jsonl")


def test_reparse_output_equals_the_crawls_items(crawled, tmp_path):
    data_dir, crawl_items = crawled
    out = tmp_path / "derived" / "pages.jsonl"
    result = run_scrapy("reparse", "site", "-s", f"DATA_DIR={data_dir}", "-o", str(out))
    assert result.returncode == 0, result.stderr
    items = read_jsonl(out)
    assert len(items) == 11  # the HTML pages: 8 pages, 2 products, the redirect
    assert canon(items) == canon(crawl_items)
    assert f"Re-parsed {len(PATHS)} records into 11 items" in result.stderr
    assert not list(out.parent.glob(".*tmp*"))


def test_pool_over_byte_ranges_gives_the_same_items(crawled, tmp_path):
    data_dir, crawl_items = crawled
    config = ReparseConfig(
        spider="site", data_dir=data_dir, workers=2, chunk_rows=3, output=tmp_path / "p.jsonl"
    )
    rows = select_rows(config)
    assert rows.count() == len(PATHS)
    tasks = list(plan(rows, data_dir, chunk_rows=3))
    assert len(tasks) == 5 and all(len(t.rows) <= 3 for t in tasks)
    assert all(a.end <= b.start for a, b in zip(tasks, tasks[1:], strict=False))
    summary = Reparse(config).run()
    assert summary.exit_code == 0
    assert summary.records == len(PATHS)
    assert canon(read_jsonl(tmp_path / "p.jsonl")) == canon(crawl_items)
    assert summary.stats["reparse/items"] == 11


def test_pool_ends_in_a_process_whose_sigterm_handler_only_logs(crawled, tmp_path):
    # What `scrapy reparse` is: Scrapy's shutdown handlers installed, then the pool
    # forked. A worker still waiting for a task when the pool ends must die of the
    # SIGTERM the pool sends it; whether one is left waiting is a race, hence the runs.
    data_dir, _ = crawled
    script = textwrap.dedent(
        f"""
        import signal, sys
        from pathlib import Path
        from crawler.reparse.plan import ReparseConfig
        from crawler.reparse.runner import Reparse
        signal.signal(signal.SIGTERM, lambda signum, frame: print("SIGTERM", file=sys.stderr))
        for run in range(15):
            config = ReparseConfig(
                spider="site", data_dir=Path({str(data_dir)!r}), workers=2, chunk_rows=3,
                output=Path({str(tmp_path)!r}) / f"{{run}}.jsonl",
            )
            assert Reparse(config).run().exit_code == 0
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the reparse pool did not end: a worker outlived its SIGTERM")
    assert proc.returncode == 0, stderr
    assert all(len(read_jsonl(tmp_path / f"{run}.jsonl")) == 11 for run in range(15))


@dataclasses.dataclass
class Inner:
    name: str
    score: float = 0.5


@dataclasses.dataclass
class Outer:
    title: str
    tags: list
    by_name: dict
    inner: Inner
    missing: object = dataclasses.field(init=False)


def test_items_become_plain_dicts_for_parquet_as_itemadapter_makes_them():
    item = Outer(
        "t",
        ["a", 1, Inner("x"), [Inner("y", 2.0)], {"k": Inner("z")}],
        {"one": 1, "inner": Inner("w"), "list": [Inner("v")]},
        Inner("u", float("inf")),
    )
    assert plain(item) == ItemAdapter(item).asdict()
    assert plain({"a": [item]}) == {"a": [ItemAdapter(item).asdict()]}
    assert "missing" not in plain(item)  # a field the instance lacks, as ItemAdapter


def test_parquet_is_written_without_pandas_and_leaves_it_importable(tmp_path):
    # In a process of its own: pandas is imported in this one by other tests.
    script = textwrap.dedent(
        f"""
        import sys
        from crawler.reparse.feeds import ItemFileWriter
        writer = ItemFileWriter({str(tmp_path / "out.parquet")!r})
        writer.write_dict({{"a": 1, "b": ["x", None], "c": {{"k": "v"}}}})
        writer.write_dict({{"a": None, "b": [], "c": {{"k": "w"}}}})
        writer.close()
        print("pandas" in sys.modules)
        import pandas
        import pyarrow.parquet as pq
        frame = pq.read_table({str(tmp_path / "out.parquet")!r}).to_pandas()
        print(type(frame).__name__, len(frame))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "DataFrame", "2"]
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert rows == [
        {"a": 1, "b": ["x", None], "c": {"k": "v"}},
        {"a": None, "b": [], "c": {"k": "w"}},
    ]


def test_where_limit_callback_and_formats(crawled, tmp_path):
    data_dir, _ = crawled
    common = ["-s", f"DATA_DIR={data_dir}", "--workers", "1"]
    result = run_scrapy(
        "reparse",
        "products",
        *common,
        "--where",
        "url like '%/product/%'",
        "-o",
        str(tmp_path / "p.parquet"),
    )
    assert result.returncode == 0, result.stderr
    table = pq.read_table(tmp_path / "p.parquet").to_pylist()
    assert sorted(r["sku"] for r in table) == ["SKU-000003", "SKU-000004"]
    result = run_scrapy("reparse", "site", *common, "--limit", "2", "-o", str(tmp_path / "s.csv"))
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert lines[0].startswith("url,final_url,status,title") and len(lines) <= 3
    for suffix in ("json", "xml"):
        result = run_scrapy("reparse", "site", *common, "-o", str(tmp_path / f"s.{suffix}"))
        assert result.returncode == 0, result.stderr
        assert (tmp_path / f"s.{suffix}").stat().st_size > 100
    some = run_scrapy("reparse", "site", *common, "--archive", "archive/*.warc.gz")
    assert some.returncode == 0 and f"Re-parsed {len(PATHS)} records" in some.stderr
    none = run_scrapy("reparse", "site", *common, "--archive", "archive/nothing-*.warc.gz")
    assert none.returncode == 0 and "Re-parsed 0 records" in none.stderr
    bad = run_scrapy("reparse", "site", *common, "-o", str(tmp_path / "s.txt"))
    assert bad.returncode == 2 and "unknown output format '.txt'" in bad.stderr
    bad = run_scrapy("reparse", "site", *common, "--callback", "nope")
    assert bad.returncode == 1 and "has no callback 'nope'" in bad.stderr
    bad = run_scrapy("reparse", "site", *common, "--where", "no_such_column = 1")
    assert bad.returncode == 1 and "--where" in bad.stderr


FOLLOWER = """
    import scrapy

    class FollowerSpider(scrapy.Spider):
        name = "follower"

        def parse(self, response):
            if isinstance(response, scrapy.http.TextResponse):
                for href in response.css("a::attr(href)").getall():
                    yield response.follow(href)
"""


def test_requests_from_callbacks_are_ignored_and_counted(site, crawled, tmp_path):
    data_dir, _ = crawled
    package = tmp_path / "mods" / "followers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "follower.py").write_text(textwrap.dedent(FOLLOWER))
    # Every link of every stored page that reaches the callback (a 404 does not).
    pages = [r for r in catalog_rows(data_dir).values() if r.status == 200]
    links = sum(
        len(re.findall(rb"<a href=", site.payload(urlsplit(r.final_url).path))) for r in pages
    )
    site.reset_counts()
    result = run_scrapy(
        "reparse", "follower", "-s", f"DATA_DIR={data_dir}", "-s", "SPIDER_MODULES=followers",
        "--workers", "1", pythonpath=[tmp_path / "mods"],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.findall(r"requests ignored: ([\d,]+);", result.stderr) == [f"{links:,}"]
    assert dict(site.counts) == {}  # not one request reached the server


SHOP_V1 = """
    import scrapy

    class ShopSpider(scrapy.Spider):
        name = "shop"

        def __init__(self, urls=None, **kwargs):
            super().__init__(**kwargs)
            self.urls = urls

        async def start(self):
            for line in open(self.urls):
                yield scrapy.Request(line.strip())

        def parse(self, response):
            yield {"url": response.url, "title": response.css("title::text").get()}
"""
SHOP_V2 = SHOP_V1.replace(
    'yield {"url": response.url, "title": response.css("title::text").get()}',
    'if "/page/3" in response.url:\n'
    '                raise ValueError("parser bug")\n'
    '            yield {"url": response.url, "title": response.css("title::text").get().upper(),\n'
    '                   "h1": response.css("h1::text").get()}',
)


def test_changed_parser_gives_changed_items_without_any_request(site, tmp_path):
    package = tmp_path / "mods" / "shopspiders"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "shop.py").write_text(textwrap.dedent(SHOP_V1))
    urls = [f"{site.base_url}/page/{n}.html" for n in (1, 2, 3, 4)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    data_dir = tmp_path / "data"
    common = ["-s", f"DATA_DIR={data_dir}", "-s", "SPIDER_MODULES=shopspiders"]
    crawl = run_scrapy(
        "crawl", "shop", "-a", f"urls={url_file}", *common, "-o", str(tmp_path / "v1.jsonl"),
        "-s", "AUTOTHROTTLE_ENABLED=0", pythonpath=[tmp_path / "mods"],
    )  # fmt: skip
    assert crawl.returncode == 0, crawl.stderr
    assert sorted(i["title"] for i in read_jsonl(tmp_path / "v1.jsonl")) == [
        f"Page {n}" for n in (1, 2, 3, 4)
    ]
    (package / "shop.py").write_text(textwrap.dedent(SHOP_V2))
    site.reset_counts()
    result = run_scrapy(
        "reparse", "shop", *common, "-o", str(tmp_path / "v2.jsonl"), "--workers", "2",
        pythonpath=[tmp_path / "mods"],
    )  # fmt: skip
    assert dict(site.counts) == {}  # not one request reached the server
    items = read_jsonl(tmp_path / "v2.jsonl")
    assert sorted(i["title"] for i in items) == ["PAGE 1", "PAGE 2", "PAGE 4"]
    assert all(i["h1"].startswith("Page") for i in items)
    # The callback's exception is reported with the url and key, counted, and the run goes on.
    assert result.returncode == 1
    row = next(r for r in catalog_rows(data_dir).values() if r.url.endswith("/page/3.html"))
    assert f"failed on {row.url} (key {row.key}): ValueError: parser bug" in result.stderr
    assert "1 callback exceptions" in result.stderr


def _damage(data_dir: Path) -> tuple[str, int, int]:
    """Corrupt one record in the middle and cut the file inside another."""
    with Catalog(data_dir / "metadata.db", readonly=True) as catalog:
        rows = list(catalog.rows('1 ORDER BY "offset"'))
    corrupt, cut = rows[3], rows[-1]
    path = data_dir / corrupt.archive
    with open(path, "r+b") as f:
        f.seek(corrupt.offset + corrupt.length // 2)
        f.write(b"\xff" * 64)
    with open(path, "r+b") as f:
        f.truncate(cut.offset + cut.length // 2)
    return str(path), corrupt.offset, cut.offset


def test_corrupt_and_truncated_records_are_reported_and_skipped(crawled, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(crawled[0], data_dir)
    path, corrupt_at, cut_at = _damage(data_dir)
    out = tmp_path / "pages.jsonl"
    result = run_scrapy("reparse", "site", "-s", f"DATA_DIR={data_dir}", "-o", str(out))
    assert result.returncode == 1
    assert f"{path}: offset {corrupt_at}:" in result.stderr
    assert f"{path}: offset {cut_at}:" in result.stderr
    assert "error: 2 records skipped" in result.stderr
    assert f"Re-parsed {len(PATHS) - 2} records" in result.stderr
    assert out.exists()  # the records that could be read are all there


ENDING_SPIDER = """
import atexit
import os
from pathlib import Path

from spiders.site import SiteSpider

atexit.register(Path(os.environ["ATEXIT_MARK"]).write_text, "ran")


class EndingSpider(SiteSpider):
    name = "ending"
"""


def test_reparse_ends_as_a_process_does_less_its_teardown(crawled, tmp_path):
    # The command ends its process itself once its work is done: its exit status, its
    # last line and the atexit functions as at any exit; under --profile it returns,
    # since Scrapy writes the statistics after it.
    data_dir, _ = crawled
    (tmp_path / "mods" / "endspiders").mkdir(parents=True)
    (tmp_path / "mods" / "endspiders" / "__init__.py").write_text("")
    (tmp_path / "mods" / "endspiders" / "ending.py").write_text(ENDING_SPIDER)
    out, profile, mark = tmp_path / "pages.jsonl", tmp_path / "r.prof", tmp_path / "atexit"
    args = ("reparse", "ending", "-s", f"DATA_DIR={data_dir}", "-o", str(out), "--limit", "3")
    args += ("-s", "SPIDER_MODULES=endspiders")
    kwargs = {"pythonpath": [tmp_path / "mods"], "env": {"ATEXIT_MARK": str(mark)}}
    result = run_scrapy(*args, **kwargs)
    assert result.returncode == 0, result.stderr
    assert result.stderr.rstrip().endswith(f"output: {out}")
    assert len(read_jsonl(out)) == 3
    assert mark.read_text() == "ran"
    result = run_scrapy(*args, "--profile", str(profile), **kwargs)
    assert result.returncode == 0, result.stderr
    assert profile.stat().st_size > 0


def test_each_pages_tree_is_freed_once_its_callback_is_done(crawled):
    # A text response and the selector it caches refer to each other: without a hand,
    # each page's parsed tree would wait for the cyclic garbage collector.
    data_dir, _ = crawled
    reparser = Reparser("site", "parse", {}, {}, TABLES)
    parse, seen = reparser.callback, []

    def callback(response):
        if isinstance(response, TextResponse):
            assert response.css("title")  # the selector is built, and cached
        seen.append(weakref.ref(response))
        return parse(response)

    reparser.callback = callback
    gc.disable()
    try:
        for task in plan(select_rows(ReparseConfig("site", data_dir)), data_dir):
            assert reparser.run_task(task).pages
        alive = [ref() for ref in seen if ref() is not None]
    finally:
        gc.enable()
    assert len(seen) == 12  # every response but the 404
    assert alive == []


def test_a_bad_spider_fails_before_the_catalog_is_read(crawled, tmp_path):
    data_dir, _ = crawled
    out = tmp_path / "items.jsonl"
    config = ReparseConfig("nosuch", data_dir, where="no_such_column = 1", output=out)
    with pytest.raises(ReparseError, match="no spider named 'nosuch'"):
        Reparse(config).run()
    assert list(tmp_path.iterdir()) == []


def test_progress_line():
    stream = io.StringIO()
    progress = Progress(200, stream)
    assert not progress.enabled  # not a terminal: no bar
    line = progress.line(50, 1)
    assert "50/200 (25%)" in line and "pages/s" in line and "ETA" in line and "1 errors" in line


PROBE_SPIDER = """
    import scrapy
    from scrapy.http import TextResponse

    class ProbeSpider(scrapy.Spider):
        name = "probe"

        def parse(self, response):
            yield {
                "class": type(response).__name__,
                "url": response.url,
                "status": response.status,
                "encoding": response.encoding if isinstance(response, TextResponse) else None,
                "content_type": (response.headers.get("Content-Type") or b"").decode(),
                "body_length": len(response.body),
                "key": response.meta["catalog_key"],
                "listed_url": response.meta["catalog_url"],
                "fetched_at": response.meta["fetched_at"],
                "request_url": response.request.url,
            }
"""


@deferred_f_from_coro_f
async def test_responses_are_rebuilt_faithfully(site, tmp_path, monkeypatch):
    base = site.base_url
    paths = ["page/1.html", "latin1/6", "binary/5", "redirect/4", "sitemap.xml", "gone/2"]
    data_dir = tmp_path / "data"
    await crawl_site([f"{base}/{p}" for p in paths], data_dir)
    package = tmp_path / "mods" / "probespiders"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(textwrap.dedent(PROBE_SPIDER))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    config = ReparseConfig(
        spider="probe",
        data_dir=data_dir,
        workers=1,
        output=tmp_path / "probe.jsonl",
        settings={"SPIDER_MODULES": ["probespiders"], "HTTPERROR_ALLOWED_CODES": [410]},
    )
    summary = Reparse(config).run()
    assert summary.exit_code == 0 and summary.records == len(paths)
    found = {i["listed_url"]: i for i in read_jsonl(tmp_path / "probe.jsonl")}
    rows = {r.url: r for r in catalog_rows(data_dir).values()}
    assert set(found) == set(rows)
    for url, item in found.items():
        row = rows[url]
        assert (item["key"], item["fetched_at"], item["status"]) == (
            row.key,
            row.fetched_at,
            row.status,
        )
        assert item["url"] == row.final_url and item["request_url"] == url
        assert item["body_length"] == row.bytes
    assert found[f"{base}/page/1.html"]["class"] == "HtmlResponse"
    assert found[f"{base}/latin1/6"]["encoding"] == "cp1252"  # how Scrapy reads iso-8859-1
    assert found[f"{base}/binary/5"]["class"] == "Response"
    assert found[f"{base}/sitemap.xml"]["class"] == "XmlResponse"
    assert found[f"{base}/redirect/4"]["url"] == f"{base}/page/4.html"
    assert found[f"{base}/gone/2"]["content_type"] == "text/plain"  # allowed by setting
