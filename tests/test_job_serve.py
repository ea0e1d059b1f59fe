"""``scrapy job serve``: the live page of a job opened in headless Chromium while two
crawl processes run through a proxy with credentials; the page updates by itself, logs
no console error, shows no credential and reads at 1280 and 390 px. A token guards it
once it listens beyond this machine, and nothing can be written through it."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from crawler.hub import Hub, ProxyPool
from crawler.hub.heartbeats import Beat, HeartbeatStore
from crawler.hub.jobs import JobStore
from crawler.render import BrowserNotFoundError, find_browser
from tests import launcher
from tests.conftest import ROOT, crawl_env
from tests.jobwatch import start_crawls, stop
from tests.polling import wait_until
from tests.proxy_servers import PROXY_PASSWORD, PROXY_USER, TinyProxy
from tests.servers import need

TOKEN = "t0ken-8c1d"
STATS_JS = """() => Object.fromEntries(Array.from(document.querySelectorAll('[data-stat]'))
    .map(e => [e.dataset.stat, Number(e.dataset.value)]))"""
MARKS_JS = """name => Array.from(
    document.querySelectorAll(`#plot-${name} svg [id^="${name}-mark-"]`)
).filter(e => { const b = e.getBBox(); return b.width > 0 || b.height > 0; }).length"""
OVERFLOW_JS = "() => document.documentElement.scrollWidth - window.innerWidth"


def serve(hub: str, tmp_path: Path, *args: str):
    """Start ``scrapy job serve ARGS --port 0``; (process, the URL it printed)."""
    log = tmp_path / "serve.log"
    env = {**crawl_env(), "HUB_URL": hub}
    command = [sys.executable, "-m", "scrapy", "job", "serve", *args, "--port", "0"]
    proc = launcher.start(command, log=log, cwd=ROOT, env=env, new_session=True)
    said = wait_until(
        lambda: re.search(r"at (http://\S+) ", log.read_text()),
        "the served URL",
        timeout=60,
        proc=proc,
    )
    return proc, said[1]


def ended(proc) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def get(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Browser:
    """Headless Chromium on a thread of its own: Playwright's sync API refuses a thread
    whose asyncio loop runs (pytest-twisted's), and wants every call from one thread."""

    def __init__(self) -> None:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            need("Playwright is not installed (pip install scrapy-playwright)")
        try:
            self.executable = find_browser(None)
        except BrowserNotFoundError:
            need("Chromium is not installed (Debian: apt-get install chromium)")
        self.pool = ThreadPoolExecutor(1)
        self.playwright = self.browser = None

    def run(self, fn, *args):
        return self.pool.submit(self._run, fn, *args).result(timeout=300)

    def _run(self, fn, *args):
        if self.browser is None:
            from playwright.sync_api import sync_playwright

            self.playwright = sync_playwright().start()
            self.browser = self.playwright.chromium.launch(
                executable_path=self.executable, args=["--no-sandbox"], headless=True
            )
        return fn(self.browser, *args)

    def close(self) -> None:
        def stop_browser():
            if self.browser is not None:
                self.browser.close()
                self.playwright.stop()

        self.pool.submit(stop_browser).result(timeout=120)
        self.pool.shutdown()


@pytest.fixture(scope="module")
def browser():
    opened = Browser()
    yield opened
    opened.close()


def watch_page(browser, url: str, width: int, shots: Path) -> dict:
    """Open the page; read it, then again once its script has refreshed it with more
    pages fetched; a screenshot each time."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: console.append(f"requestfailed: {r.url}"))
        page.goto(url, wait_until="load")
        first = page.evaluate(STATS_JS)
        page.screenshot(path=str(shots / f"{width}-1.png"), full_page=True)
        page.wait_for_function(
            "n => Number(document.querySelector('[data-stat=\"job:pages\"]').dataset.value) > n",
            arg=first["job:pages"],
            timeout=60_000,
        )
        page.wait_for_timeout(300)  # what the refresh drew is painted
        page.screenshot(path=str(shots / f"{width}-2.png"), full_page=True)
        return {
            "first": first,
            "second": page.evaluate(STATS_JS),
            "html": page.content(),
            "status": page.locator("#status").text_content(),
            "overflow": page.evaluate(OVERFLOW_JS),
            "marks": {name: page.evaluate(MARKS_JS, name) for name in ("node-rates", "failures")},
            "states": page.eval_on_selector_all(
                "tr[data-state]", "rs => rs.map(r => r.dataset.state)"
            ),
            "console": console,
        }
    finally:
        context.close()


def test_the_page_updates_during_a_crawl_and_shows_no_credential(site, tmp_path, browser):
    if shutil.which("tinyproxy") is None:
        need("tinyproxy is not installed (Debian: apt-get install tinyproxy)")
    hub = f"sqlite:///{tmp_path}/hub.db"
    # One each for the two processes, a password in each URL.
    proxies = [TinyProxy(f"live{n}", tmp_path, auth=(PROXY_USER, PROXY_PASSWORD)) for n in range(2)]
    crawls, server = [], None
    try:
        for proxy in proxies:
            proxy.start()
        with Hub.open(hub) as opened:
            ProxyPool(opened).add([proxy.url for proxy in proxies])
            JobStore(opened).create("watch", "site", {})
        crawls = start_crawls(
            hub,
            site,
            tmp_path,
            2,
            "-s",
            "PROXY_LEASES_PER_PROCESS=1",
            "-s",
            "PROXY_ROTATE_EVERY=100000",
        )
        server, url = serve(hub, tmp_path, "watch", "--interval", "1", "--token", TOKEN)
        assert url.endswith(f"/?token={TOKEN}") and url.startswith("http://127.0.0.1:")
        view = f"{url.split('?')[0]}view?token={TOKEN}"
        wait_until(
            lambda: get(view)[1].count('data-state="fetching"') == 2,
            "both processes fetching",
            proc=crawls[0]["proc"],
        )
        shots = tmp_path / "shots"
        shots.mkdir()
        wide = browser.run(watch_page, url, 1280, shots)
        narrow = browser.run(watch_page, url, 390, shots)
    finally:
        stop(crawls)
        if server is not None:
            assert ended(server) == 0
        for proxy in proxies:
            proxy.stop()
    for page in (wide, narrow):
        assert page["console"] == [], page["console"]
        assert page["second"]["job:pages"] > page["first"]["job:pages"], "the page updates itself"
        assert page["status"].startswith("updated "), page["status"]
        assert PROXY_PASSWORD not in page["html"]
        for proxy in proxies:
            assert f"{PROXY_USER}:***@127.0.0.1:{proxy.port}" in page["html"], "leased, redacted"
        assert page["states"] == ["fetching", "fetching"]
        assert page["second"]["job:processes"] == 2
        assert page["overflow"] <= 0, f"{page['overflow']} px sideways"
    assert wide["marks"]["node-rates"] > 0, "pages/s per node drawn"
    for width in (1280, 390):
        assert (shots / f"{width}-1.png").read_bytes() != (shots / f"{width}-2.png").read_bytes()


def test_a_token_guards_the_page_and_nothing_is_written_through_it(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    with Hub.open(hub) as opened:
        JobStore(opened).create("watch", "site", {})
        HeartbeatStore(opened).write(
            Beat(id="n/1", node="n", pid=1, period=5.0, state="fetching", job="watch")
        )
        (before,) = HeartbeatStore(opened).read("watch")
    server, url = serve(hub, tmp_path, "watch", "--bind", "0.0.0.0", "--token", TOKEN)
    try:
        port = url.split(":")[2].split("/")[0]
        base = f"http://127.0.0.1:{port}"
        assert get(f"{base}/")[0] == 403
        assert get(f"{base}/view?token=wrong")[0] == 403
        status, html = get(f"{base}/?token={TOKEN}")
        assert status == 200 and 'data-process="n/1"' in html
        assert get(f"{base}/view", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert get(f"{base}/live.js")[0] == 200  # the script holds no data
        for method in ("POST", "PUT", "DELETE"):
            assert get(f"{base}/?token={TOKEN}", method)[0] == 405
        assert get(f"{base}/nothing?token={TOKEN}")[0] == 404
    finally:
        assert ended(server) == 0
    with Hub.open(hub) as opened:
        (row,) = HeartbeatStore(opened).read("watch")
    assert row == before, "the hub as it was"
