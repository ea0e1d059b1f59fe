"""JS rendering with scrapy-playwright: what renders, what is stored, crashes, proxies.

Past 400 lines: its tests share one browser set-up and its checks; the promises of
docs/how-to/rendering.md are in test_render_promises.py.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import scrapy
from scrapy.exceptions import NotConfigured, UsageError
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler
from warcio.archiveiterator import ArchiveIterator

from addons.render import HANDLER, RenderAddon
from crawler.fetches import response_fetch
from crawler.render import (
    DEBIAN_CHROMIUM,
    BrowserNotFoundError,
    RenderConfig,
    RenderConfigError,
    Wait,
    find_browser,
)
from crawler.storage.catalog import Catalog
from crawler.storage.datadir import DataDir
from crawler.storage.formats.warc import FORMAT as WARC
from crawler.storage.formats.warc import WarcWriter
from middlewares.render import RenderMiddleware, browser_proxy
from tests import launcher
from tests.checks import actions, catalog_rows, rows_by_url
from tests.cmdline import canon, read_jsonl, run_scrapy
from tests.conftest import ROOT, crawl_env, kill_group, start_crawl, write_urls
from tests.crawls import crawl, crawl_site
from tests.events import committed_rows, wait_until
from tests.factories import rendered_fetch
from tests.proxy_servers import PROXY_PASSWORD, proxy_pool  # noqa: F401
from tests.servers import need

WAIT_READY = "RENDER_WAIT=selector=[data-ready]"


def need_chromium() -> None:
    if importlib.util.find_spec("scrapy_playwright") is None:
        need("scrapy-playwright is not installed (pip install scrapy-playwright)")
    try:
        find_browser(os.environ.get("CHROMIUM_PATH"))
    except BrowserNotFoundError:
        need("Chromium is not installed (Debian: apt-get install chromium)")


# -- choosing what renders (no browser) ------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "wait"),
    [
        ("load", Wait()),
        (None, Wait()),
        ("networkidle", Wait(network_idle=True)),
        ("selector=#a .b", Wait(selector="#a .b")),
        ("selector=[data-ready]&timeout=200", Wait(selector="[data-ready]", timeout_ms=200)),
        ({"selector": "p", "timeout": 5}, Wait(selector="p", timeout_ms=5)),
    ],
)
def test_wait_specs(spec, wait):
    assert Wait.parse(spec) == wait


def test_bad_wait_and_pattern_name_the_problem():
    with pytest.raises(RenderConfigError, match="networkidle"):
        Wait.parse("idle")
    with pytest.raises(RenderConfigError, match="RENDER_URL_PATTERNS"):
        RenderConfig.from_settings(Settings({"RENDER_URL_PATTERNS": ["("]}))


def test_off_unless_asked_for():
    assert not RenderConfig.from_settings(Settings()).enabled
    with pytest.raises(NotConfigured, match="rendering is off"):
        RenderMiddleware.from_crawler(get_crawler())
    # The add-on leaves the crawl alone: Scrapy's own handlers, no middleware.
    settings = Settings({"DOWNLOADER_MIDDLEWARES": {}})
    RenderAddon().update_settings(settings)
    assert "http" not in settings.getdict("DOWNLOAD_HANDLERS")
    assert not settings.getdict("DOWNLOADER_MIDDLEWARES")


def _mw(**settings) -> RenderMiddleware:
    return RenderMiddleware.from_crawler(get_crawler(settings_dict=settings))


def test_patterns_meta_and_waits_choose_requests():
    from scrapy import Request

    mw = _mw(
        RENDER_URL_PATTERNS={r"/js/": None, r"/slow/": "networkidle"},
        RENDER_WAIT="selector=#content",
    )
    assert mw.wait_for(Request("http://h/js/1")) == Wait(selector="#content")
    assert mw.wait_for(Request("http://h/slow/1")) == Wait(network_idle=True)
    assert mw.wait_for(Request("http://h/page/1.html")) is None
    assert mw.wait_for(Request("http://h/page/1", meta={"render": True})) == Wait(
        selector="#content"
    )
    assert mw.wait_for(Request("http://h/page/1", meta={"render": "timeout=50"})) == Wait(
        timeout_ms=50
    )
    assert mw.wait_for(Request("http://h/js/1", meta={"render": False})) is None
    assert mw.wait_for(Request("http://h/js/1", meta={"render_wait": "networkidle"})) == Wait(
        network_idle=True
    )
    robots = Request("http://h/js/robots.txt", meta={"dont_obey_robotstxt": True})
    assert mw.wait_for(robots) is None


def test_request_becomes_a_playwright_request_in_its_lease_context():
    from scrapy import Request

    mw = _mw(RENDER_ENABLED=True)
    plain = Request("http://h/page/1")
    mw.process_request(plain)
    assert "playwright" not in plain.meta
    request = Request(
        "http://h/js/1", meta={"render": True, "proxy": "http://u:p%40ss@127.0.0.1:3128"}
    )
    request.headers["Proxy-Authorization"] = "Basic xyz"
    mw.process_request(request)
    meta = request.meta
    assert meta["playwright"] is True and "proxy" not in meta
    assert meta["playwright_context_kwargs"] == {
        "proxy": {"server": "http://127.0.0.1:3128", "username": "u", "password": "p@ss"}
    }
    assert b"Proxy-Authorization" not in request.headers
    assert mw.inflight[meta["playwright_context"]] == 1
    mw.process_exception(request, RuntimeError("Page crashed"))
    assert mw.inflight[meta["playwright_context"]] == 0
    assert mw.crawler.stats.get_value("render/errors/RuntimeError") == 1


def test_browser_proxy_without_credentials():
    assert browser_proxy("http://10.0.0.1:8080") == {"server": "http://10.0.0.1:8080"}


def test_rendered_fetch_keeps_the_server_answer_and_the_dom():
    from scrapy import Request
    from scrapy.http import HtmlResponse

    request = Request("http://h/js/1", meta={"catalog_url": "http://h/js/1"})
    request.meta["render_source"] = {
        "url": "http://h/js/1",
        "status": 200,
        "headers": [("content-type", "text/html"), ("content-encoding", "gzip")],
        "body": b"<html>raw</html>",
        "request_headers": [("user-agent", "x"), ("authorization", "secret")],
    }
    response = HtmlResponse("http://h/js/1", body=b"<html>dom</html>", encoding="utf-8")
    fetch = response_fetch("k", request, response)
    assert fetch.body == b"<html>raw</html>" and fetch.rendered_body == b"<html>dom</html>"
    assert ("X-Archive-Orig-content-encoding", "gzip") in fetch.response_headers
    assert fetch.request_headers == [("user-agent", "x")]


# -- browser location ---------------------------------------------------------------------


def test_missing_browser_is_an_error_naming_both_ways(monkeypatch):
    with pytest.raises(BrowserNotFoundError) as info:
        find_browser("/nonexistent/chromium")
    message = str(info.value)
    assert "CHROMIUM_PATH=/nonexistent/chromium" in message
    assert "apt-get install chromium" in message and "playwright install chromium" in message
    monkeypatch.setattr("crawler.render.playwright_browser", lambda: None)
    monkeypatch.setattr("crawler.render.DEBIAN_CHROMIUM", "/nonexistent/debian")
    with pytest.raises(BrowserNotFoundError, match="none was found"):
        find_browser(None)
    with pytest.raises(UsageError, match="ARCHIVE_FORMAT=warc"):
        RenderAddon().update_settings(Settings({"RENDER_ENABLED": True, "ARCHIVE_FORMAT": "zip"}))
    with pytest.raises(UsageError, match="apt-get install chromium"):
        RenderAddon().update_settings(Settings({"RENDER_ENABLED": True}))


def test_missing_browser_stops_the_crawl_before_it_starts(site, tmp_path, data_dir):
    site.reset_counts()
    urls = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/js/1"])
    env = {"CHROMIUM_PATH": "/nonexistent"}
    result = _run(urls, data_dir, "-a", "render=1", env=env, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "CHROMIUM_PATH=/nonexistent" in result.stderr
    assert "apt-get install chromium" in result.stderr
    assert "playwright install chromium" in result.stderr
    assert "Traceback" not in result.stderr
    assert site.counts["/js/1"] == 0


def test_addon_sets_up_scrapy_playwright():
    need_chromium()
    settings = Settings(
        {"RENDER_URL_PATTERNS": ["/js/"], "RENDER_MAX_PAGES": 2, "DOWNLOADER_MIDDLEWARES": {}}
    )
    RenderAddon().update_settings(settings)
    assert settings.getdict("DOWNLOAD_HANDLERS") == {"http": HANDLER, "https": HANDLER}
    assert settings.getint("PLAYWRIGHT_MAX_PAGES_PER_CONTEXT") == 2
    assert settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")["headless"] is True
    assert "playwright.async_api.Error" in settings.getlist("RETRY_EXCEPTIONS")
    assert settings.getdict("DOWNLOADER_MIDDLEWARES")["middlewares.render.RenderMiddleware"] == 745
    extensions = settings.getdict("EXTENSIONS")
    assert extensions["extensions.tree_memory.TreeMemoryUsage"] == 0
    assert extensions["scrapy.extensions.memusage.MemoryUsage"] is None
    blocker = settings["PLAYWRIGHT_ABORT_REQUEST"]
    assert blocker.blocked == frozenset({"image", "media", "font"})


# -- crawls with a real browser ----------------------------------------------------------------


def _run(urls, data_dir, *args, env=None, timeout=240, **kwargs):
    full_env = {**crawl_env(), **(env or {})}
    from tests.conftest import crawl_command

    return launcher.run(
        crawl_command(urls, data_dir, *args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        **kwargs,
    )


def _stat(log: str, name: str) -> int:
    found = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(found.group(1)) if found else 0


def records_by_id(path: Path) -> dict[str, tuple[object, bytes]]:
    """WARC-Record-ID -> (record, content) of every record of one archive file."""
    out = {}
    with open(path, "rb") as f:
        for record in ArchiveIterator(f):
            content = record.content_stream().read()
            out[record.rec_headers.get_header("WARC-Record-ID")] = (record, content)
    return out


def _served(site, url: str) -> bytes:
    path, _, query = url.split(site.base_url, 1)[1].partition("?")
    if path.startswith("/js/") and query.startswith("delay="):
        return site.js_page(int(path.rsplit("/", 1)[1]), int(query[6:])).body
    return site.payload(path)


def assert_rendered_rows_readable(data_dir: Path, site) -> dict:
    """Every row's record is readable and matches the row; a rendered row's record is
    the DOM (a conversion record) that refers to a response record holding exactly what
    the server sent; other rows hold what the server sent."""
    rows = catalog_rows(data_dir)
    for row in rows.values():
        path = DataDir(data_dir).resolve(row.archive)
        stored = DataDir(data_dir).read(row)
        warc = dict(stored.warc_headers)
        assert len(stored.body) == row.bytes and stored.status == row.status, row
        assert warc["WARC-Payload-Digest"] == row.payload_digest
        served = _served(site, row.final_url)
        if not row.rendered:
            assert stored.body == served
            continue
        assert warc["WARC-Type"] == "conversion"
        n = row.final_url.rsplit("/", 1)[1].split("?")[0]
        assert f"<h1>Rendered {n}</h1>".encode() in stored.body
        response, content = records_by_id(path)[warc["WARC-Refers-To"]]
        assert response.rec_type == "response"
        assert content == served, "the response record holds what the server sent"
    return rows


@deferred_f_from_coro_f
async def test_rendered_and_plain_pages_in_one_crawl(site, tmp_path, data_dir, caplog):
    need_chromium()
    caplog.set_level(logging.INFO)
    site.reset_counts()
    js = [f"{site.base_url}/js/{n}" for n in range(5)] + [f"{site.base_url}/js/5?delay=300"]
    plain = [f"{site.base_url}/page/{n}.html" for n in range(6)]
    urls = write_urls(tmp_path / "urls.txt", js + plain)
    out = tmp_path / "items.jsonl"
    settings = {"RENDER_URL_PATTERNS": "/js/", "RENDER_WAIT": WAIT_READY.split("=", 1)[1]}
    feed = {"FEEDS": {str(out): {"format": "jsonlines"}}}
    stats = (await crawl_site(urls, data_dir, {**settings, **feed}, summaries="1")).stats

    items = {i["url"]: i for i in read_jsonl(out)}
    for url in js:
        n = url.rsplit("/", 1)[1].split("?")[0]
        assert items[url]["title"] == f"JS page {n}", "the callback parsed the rendered DOM"
        assert items[url]["links"] == 1
    for url in plain:
        assert items[url]["title"].startswith("Page ")

    rows = rows_by_url(data_dir)
    assert {u: rows[u].rendered for u in js} == dict.fromkeys(js, 1)
    assert {u: rows[u].rendered for u in plain} == dict.fromkeys(plain, 0)
    assert_rendered_rows_readable(data_dir, site)

    # Only the JS pages went to the browser; its images were never fetched.
    assert stats.get_value("render/requests") == len(js)
    assert stats.get_value("playwright/request_count/navigation") == len(js)
    assert stats.get_value("playwright/request_count/aborted") == len(js)
    assert all(site.counts[f"/page/{n}.html"] == 1 for n in range(6))
    assert not any(site.counts[f"/img/{n}.png"] for n in range(6))
    assert {e["outcome"] for e in actions(data_dir)} == {"ok"}

    # A re-parse sees exactly what the callback saw.
    reparsed = tmp_path / "reparsed.jsonl"
    result = run_scrapy("reparse", "site", "-s", f"DATA_DIR={data_dir}", "-o", str(reparsed))
    assert result.returncode == 0, result.stderr[-3000:]
    assert canon(read_jsonl(reparsed)) == canon(list(items.values()))

    # Run again: everything is stored, so nothing is fetched and no browser starts.
    site.reset_counts()
    caplog.clear()
    again = (await crawl_site(urls, data_dir, settings, summaries="1")).stats
    assert again.get_value("catalog/cache_hits") == len(js) + len(plain)
    assert "Launching browser" not in caplog.text
    assert again.get_value("playwright/browser_count") is None
    assert not site.counts


@deferred_f_from_coro_f
async def test_the_default_wait_catches_content_filled_after_load(site, data_dir):
    """A timer 150 ms after load, and a fetch() after load answered 300 ms later: what a
    person would see."""
    need_chromium()
    timer = [f"{site.base_url}/js/{n}?delay=150&after=load" for n in range(400, 404)]
    fetched = [f"{site.base_url}/js/{n}?fetch=1&delay=300" for n in range(410, 414)]
    await crawl_site(timer + fetched, data_dir, {"RENDER_URL_PATTERNS": "/js/"})
    rows = rows_by_url(data_dir)
    for url in timer + fetched:
        n = url.rsplit("/", 1)[1].split("?")[0]
        stored = DataDir(data_dir).read(rows[url])
        assert rows[url].rendered == 1
        # (The script's text holds the markup too: the title is set by the script alone.)
        assert f"<title>JS page {n}</title>".encode() in stored.body, url
    assert all(site.counts[f"/data/{n}"] == 1 for n in range(410, 414))


@deferred_f_from_coro_f
async def test_crawl_without_rendering_starts_no_browser(site, data_dir, caplog):
    caplog.set_level(logging.INFO)
    urls = [f"{site.base_url}/page/{n}.html" for n in range(3)]
    stats = (await crawl_site(urls, data_dir)).stats
    # The components Scrapy logs as enabled, the handlers it starts: none of rendering.
    assert "Enabled downloader middlewares" in caplog.text
    assert "scrapy-playwright" not in caplog.text and "middlewares.render" not in caplog.text
    assert not [name for name in stats.get_stats() if name.startswith(("playwright/", "render/"))]


@deferred_f_from_coro_f
async def test_render_all_with_depth_follows_rendered_links(site, data_dir):
    """-a render=1: every request renders; links that only exist after JS are followed."""
    need_chromium()
    settings = {"RENDER_WAIT": WAIT_READY.split("=", 1)[1]}
    await crawl_site([f"{site.base_url}/js/100"], data_dir, settings, render="1", depth="2")
    rows = rows_by_url(data_dir)
    assert {u.split(site.base_url)[1] for u in rows} == {"/js/100", "/js/101", "/js/102"}
    assert all(r.rendered for r in rows.values())
    assert_rendered_rows_readable(data_dir, site)


def test_sigkill_mid_render_leaves_valid_archive_and_catalog(site, tmp_path, data_dir):
    need_chromium()
    pages = 60
    urls = [f"{site.base_url}/js/{n}?delay=150" for n in range(200, 200 + pages - 1)]
    # Held in flight until after the kill: the crawl cannot finish before it.
    held = f"{site.base_url}/hold/js/{200 + pages}"
    urls.insert(1, held)
    url_file = write_urls(tmp_path / "urls.txt", urls)
    args = ("-a", "render=1", "-s", WAIT_READY, "-s", "CATALOG_BATCH_SIZE=3")
    site.hold()
    try:
        proc = start_crawl(url_file, data_dir, *args, log_path=tmp_path / "crawl0.log")
        try:
            wait_until(lambda: committed_rows(data_dir) >= 6, "6 rows", proc=proc)
        finally:
            kill_group(proc, signal.SIGKILL)
    finally:
        site.release()
    log = (tmp_path / "crawl0.log").read_text()
    committed = assert_rendered_rows_readable(data_dir, site)
    assert len(committed) >= 6 and held not in rows_by_url(data_dir), log[-3000:]
    assert list((data_dir / "archive").glob("*.writing")), "killed with its archive open"

    result = _run(url_file, data_dir, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = assert_rendered_rows_readable(data_dir, site)
    assert set(rows_by_url(data_dir)) == set(urls)
    assert all(r.rendered for r in rows.values())
    assert not list((data_dir / "archive").glob("*.writing"))
    with Catalog(data_dir / "metadata.db", readonly=True) as catalog:
        assert catalog.count() == pages


def test_rendered_requests_go_through_leased_proxies(site, tmp_path, data_dir, proxy_pool):  # noqa: F811
    need_chromium()
    from crawler.hub import Hub, ProxyPool

    hub_url = f"sqlite:///{tmp_path}/hub.db"
    with Hub.open(hub_url) as hub:
        # The 403 proxy first: the first lease is banned, its context closed.
        pool = ProxyPool(hub)
        pool.add([proxy_pool["proxy-deny"].url])
        pool.add([proxy_pool["proxy-open"].url, proxy_pool["proxy-auth"].url])
    proxy_pool.mark()
    site.reset_counts()
    pages = 9
    urls = write_urls(
        tmp_path / "urls.txt", [f"{site.base_url}/js/{n}" for n in range(300, 300 + pages)]
    )
    settings = {
        "HUB_URL": hub_url,
        "PROXY_ROTATE_EVERY": 3,
        "PROXY_LEASES_PER_PROCESS": 1,
        "PROXY_REST_SECONDS": 0,
        "CONCURRENT_REQUESTS": 1,
        "ROBOTSTXT_OBEY": 0,
        "RENDER_MAX_CONTEXTS": 2,  # hangs unless the contexts of ended leases are closed
    }
    args = ["-a", "render=1", "-s", WAIT_READY]
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    result = _run(urls, data_dir, *args, env={"HUB_URL": ""})
    assert result.returncode == 0, result.stderr[-4000:]
    log = result.stderr

    # Each page was asked for by the browser through a proxy, as tinyproxy logs it.
    logged = [
        line
        for name in ("proxy-open", "proxy-auth")
        for line in proxy_pool[name].requests_since_mark()
        if "/js/" in line
    ]
    paths = {re.search(r"GET \S+(/js/\d+)", line).group(1) for line in logged}
    assert paths == {f"/js/{n}" for n in range(300, 300 + pages)}
    assert all(site.counts[f"/js/{n}"] == 1 for n in range(300, 300 + pages))
    # One context per lease, closed when the lease rotated.
    assert _stat(log, "proxy/leases_released/rotated") >= 2
    assert _stat(log, "proxy/bans") == 1
    assert "Closed browser context lease-1: its proxy lease ended" in log
    assert _stat(log, "render/contexts_closed") >= 3
    assert all(r.rendered for r in catalog_rows(data_dir).values())
    assert_rendered_rows_readable(data_dir, site)
    assert {e.get("proxy") for e in actions(data_dir)} - {None}
    for path in [p for p in data_dir.rglob("*") if p.is_file()]:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            import gzip

            raw = gzip.decompress(raw)
        assert PROXY_PASSWORD.encode() not in raw, f"proxy password in {path}"
    assert PROXY_PASSWORD not in log


def test_headed_under_xvfb(site, tmp_path, data_dir):
    need_chromium()
    if shutil.which("xvfb-run") is None:
        need("xvfb-run is not installed (Debian: apt-get install xvfb xauth)")
    urls = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/js/7"])
    from tests.conftest import crawl_command

    cmd = ["xvfb-run", "-a", *crawl_command(urls, data_dir, "-a", "render=1", "-s", WAIT_READY)]
    cmd += ["-s", "RENDER_HEADED=1"]
    result = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=crawl_env()
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "(headed)" in result.stderr
    assert _stat(result.stderr, "render/responses") == 1
    assert [r.rendered for r in catalog_rows(data_dir).values()] == [1]


def test_debian_chromium_is_the_fallback(monkeypatch):
    monkeypatch.setattr("crawler.render.playwright_browser", lambda: None)
    if not os.access(DEBIAN_CHROMIUM, os.X_OK):
        need("Chromium is not installed (Debian: apt-get install chromium)")
    assert find_browser(None) == DEBIAN_CHROMIUM
    monkeypatch.setattr("crawler.render.playwright_browser", lambda: "/opt/pw/chrome")
    assert find_browser(None) is None  # Playwright launches its own


CRASHED: set[str] = set()


async def crash_once(page):
    """Crash the page's renderer the first time each page is rendered."""
    if page.url not in CRASHED:
        CRASHED.add(page.url)
        session = await page.context.new_cdp_session(page)
        await session.send("Page.crash")  # never answers: the page is closed under it


class CrashSpider(scrapy.Spider):
    name = "crash"
    custom_settings = {"RENDER_ENABLED": True}

    def __init__(self, base, **kwargs):
        super().__init__(**kwargs)
        self.base = base

    async def start(self):
        from scrapy_playwright.page import PageMethod

        yield scrapy.Request(
            self.base + "/js/400",
            meta={"render": True, "render_page_methods": [PageMethod(crash_once)]},
        )
        yield scrapy.Request(self.base + "/js/401", meta={"render": "selector=[data-ready]"})

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}


@deferred_f_from_coro_f
async def test_page_crash_fails_that_request_only(site, tmp_path, data_dir, caplog):
    """A renderer crash fails its request, which is logged and retried; the crawl goes on."""
    need_chromium()
    CRASHED.clear()
    out = tmp_path / "items.jsonl"
    feed = {"FEEDS": {str(out): {"format": "jsonlines"}}}
    stats = (await crawl(CrashSpider, data_dir, feed, base=site.base_url)).stats
    titles = {i["url"].rsplit("/", 1)[1]: i["title"] for i in read_jsonl(out)}
    assert titles == {"400": "JS page 400", "401": "JS page 401"}
    assert "Browser page crashed while rendering <GET " in caplog.text
    assert stats.get_value("render/page_crashes") == 1
    retries = [e for e in actions(data_dir) if e["outcome"] == "retry"]
    assert [(e["url"].rsplit("/", 1)[1], e["error"]) for e in retries] == [
        ("400", "browser page crashed")
    ]
    assert sorted(e["url"][-3:] for e in actions(data_dir) if e["outcome"] == "ok") == [
        "400",
        "401",
    ]
    assert all(r.rendered for r in catalog_rows(data_dir).values())


def test_tree_memory_counts_child_processes():
    from scrapy.extensions.memusage import MemoryUsage

    from extensions.tree_memory import TreeMemoryUsage

    crawler = get_crawler(settings_dict={"MEMUSAGE_ENABLED": True})
    own = MemoryUsage(crawler).get_virtual_size()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; b = bytearray(64 << 20); sys.stdout.write('r'); sys.stdout.flush(); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.read(1) == b"r"
        assert TreeMemoryUsage(crawler).get_virtual_size() >= own + (60 << 20)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_archive_writes_conversion_record_and_indexes_it(tmp_path):
    """Row from the writer == row from indexing the file; the row points at the DOM."""
    writer = WarcWriter(tmp_path / "archive", tmp_path)
    row = writer.write_fetch(rendered_fetch())
    open_path = writer.path
    writer.flush()
    assert row.rendered == 1 and row.etag == '"e1"'
    stored = WARC.read(open_path, row.offset, row.length)
    assert stored.body == rendered_fetch().rendered_body and stored.status == 200
    assert dict(stored.warc_headers)["WARC-Type"] == "conversion"
    closed = writer.close()
    assert WARC.index(closed, tmp_path).rows == [row]

    # Killed after the response record but before its conversion record: no row (the
    # page is rendered again), not a row pointing at the unrendered HTML.
    writer = WarcWriter(tmp_path / "archive2", tmp_path)
    second = writer.write_fetch(rendered_fetch())
    writer.flush()
    data = writer.path.read_bytes()
    writer.close()
    path = tmp_path / "archive2" / "killed.warc.gz.open"
    path.write_bytes(data[: second.offset])
    with open(path, "rb") as f:
        kinds = [record.rec_type for record in ArchiveIterator(f)]
    assert kinds == ["warcinfo", "response", "request"]
    assert WARC.repair(path, tmp_path).indexed.rows == []


def test_catalog_migrates_version_1_to_the_current_one(tmp_path):
    import sqlite3

    from crawler.storage.catalog import MIGRATIONS, SCHEMA_VERSION

    db = tmp_path / "metadata.db"
    conn = sqlite3.connect(db)
    conn.executescript(MIGRATIONS[1])
    conn.execute(
        "INSERT INTO artifacts VALUES ('k','u','u',200,'text/html',3,NULL,NULL,'t','a',0,9,NULL,'GET')"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with Catalog(db) as catalog:
        assert catalog.version == SCHEMA_VERSION
        assert catalog.get("k").rendered == 0
        assert catalog.summary() == {"rows": 1, "bytes": 3, "by_status": {200: 1}}
