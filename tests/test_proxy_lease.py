"""ProxyLeaseMiddleware: settings, leasing, waiting, bans, and a crawl through real proxies.

Past 400 lines: its tests share one pool of real proxy servers started once for the module.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import os
import subprocess
import sys
from itertools import groupby
from pathlib import Path

import pytest
import pytest_twisted
from scrapy import Request, Spider
from scrapy.exceptions import DownloadConnectionRefusedError, DownloadTimeoutError, NotConfigured
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.test import get_crawler
from twisted.internet import error as txerror
from twisted.internet import reactor
from twisted.internet.task import deferLater

import crawler.settings as project_settings
from crawler import signals as crawler_signals
from crawler.hub import (
    Holder,
    Hub,
    HubUnavailableError,
    ProxyPool,
    RestPolicy,
    UsageCounts,
    redact_url,
)
from middlewares.proxy_lease import ProxyLeaseConfig, ProxyLeaseConfigError, ProxyLeaseMiddleware
from tests import launcher
from tests.hubs import hub_url, open_proxies  # noqa: F401 - hub_url: a fixture
from tests.proxy_servers import PROXY_PASSWORD, PROXY_USER, origin, proxy_pool  # noqa: F401
from tests.servers import free_port, need_module

ROOT = Path(__file__).resolve().parent.parent
SECRETS = [
    PROXY_PASSWORD,
    base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode(),
]


# --- settings ---------------------------------------------------------------------------
def test_config_defaults_and_settings_file_agree():
    config = ProxyLeaseConfig.from_settings(Settings({"HUB_URL": "sqlite:///hub.db"}), {})
    assert config.rotate_every == 50 and config.ban_statuses == (403, 407, 429)
    assert config.heartbeat == config.lease_ttl / 3
    for name, setting in ProxyLeaseConfig.setting_names().items():
        documented = getattr(project_settings, setting)
        value = getattr(config, name)
        assert (tuple(documented) if isinstance(documented, list) else documented) == value, setting


def test_config_reads_settings_and_environment():
    settings = Settings(
        {
            "PROXY_ROTATE_EVERY": "7",
            "PROXY_BAN_STATUSES": "403,503",
            "PROXY_BAN_BODY_MARKERS": ["captcha"],
        }
    )
    config = ProxyLeaseConfig.from_settings(settings, {"HUB_URL": "sqlite:///env.db"})
    assert (config.hub_url, config.rotate_every) == ("sqlite:///env.db", 7)
    assert config.ban_statuses == (403, 503) and config.ban_body_markers == ("captcha",)


def test_config_off_without_hub_or_when_disabled():
    with pytest.raises(NotConfigured, match="HUB_URL"):
        ProxyLeaseConfig.from_settings(Settings(), {})
    with pytest.raises(NotConfigured, match="PROXY_ENABLED"):
        ProxyLeaseConfig.from_settings(Settings({"HUB_URL": "x", "PROXY_ENABLED": False}), {})


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"PROXY_ROTATE_EVERY": 0}, "PROXY_ROTATE_EVERY"),
        ({"PROXY_LEASE_TTL": 10, "PROXY_HEARTBEAT_SECONDS": 20}, "PROXY_HEARTBEAT_SECONDS"),
        ({"PROXY_REST_JITTER": 1.5}, "PROXY_REST_JITTER"),
        ({"PROXY_LEASES_PER_PROCESS": "many"}, "PROXY_LEASES_PER_PROCESS"),
        ({"PROXY_BAN_STATUSES": "forbidden"}, "PROXY_BAN_STATUSES"),
    ],
)
def test_config_errors_name_the_setting(settings, names):
    with pytest.raises(ProxyLeaseConfigError, match=names):
        ProxyLeaseConfig.from_settings(Settings({"HUB_URL": "sqlite:///h.db", **settings}), {})


def test_no_enabled_proxies_means_direct(tmp_path):
    url = f"sqlite:///{tmp_path}/hub.db"
    with open_proxies(url) as pool:
        pool.add(["http://127.0.0.1:9"])
        pool.set_enabled(1, False)
    with pytest.raises(NotConfigured, match="no enabled proxies"):
        ProxyLeaseMiddleware.from_crawler(get_crawler(settings_dict={"HUB_URL": url}))


def test_unreachable_hub_fails_at_start():
    need_module("psycopg")
    crawler = get_crawler(
        settings_dict={"HUB_URL": "postgresql://u:hunter2@127.0.0.1:1/x", "HUB_CONNECT_TIMEOUT": 3}
    )
    with pytest.raises(HubUnavailableError, match="cannot reach the hub") as info:
        ProxyLeaseMiddleware.from_crawler(crawler)
    assert "hunter2" not in str(info.value)


# --- the middleware in process ---------------------------------------------------------------
class PlainSpider(Spider):
    name = "plain"


class BanSpider(Spider):
    name = "ban"

    def response_is_ban(self, request, response):
        if b"you are blocked" in response.body:
            return True
        return None if response.status != 403 else False

    def exception_is_ban(self, request, exception):
        return None


def make_middleware(tmp_path, spidercls=PlainSpider, url=None, proxies=None, **settings):
    url = url or f"sqlite:///{tmp_path}/hub.db"
    with open_proxies(url) as pool:
        pool.add(proxies or ["http://u:pw-secret@127.0.0.1:1", "http://127.0.0.1:2"])
    crawler = get_crawler(
        spidercls,
        settings_dict={
            "HUB_URL": url,
            "PROXY_LEASES_PER_PROCESS": 1,
            "PROXY_ROTATE_EVERY": 2,
            "PROXY_REST_SECONDS": 0,
            "PROXY_POLL_SECONDS": 0.2,
            **settings,
        },
    )
    crawler.spider = spidercls.from_crawler(crawler)
    crawler.stats.open_spider()
    mw = ProxyLeaseMiddleware.from_crawler(crawler)
    mw.spider_opened()
    return mw, crawler, url


def response(request, status=200, body=b"<html>ok</html>"):
    return HtmlResponse(request.url, status=status, body=body, request=request)


async def _send(mw, url):
    request = Request(url)
    await mw.process_request(request)
    return request


@pytest_twisted.inlineCallbacks
def test_rotation_waits_for_inflight_then_next_proxy(tmp_path):
    mw, crawler, url = make_middleware(tmp_path)
    try:
        r1 = yield deferred_from_coro(_send(mw, "http://example.com/1"))
        r2 = yield deferred_from_coro(_send(mw, "http://example.com/2"))
        assert r1.meta["proxy_label"] == r2.meta["proxy_label"] == "http://u:***@127.0.0.1:1"
        assert r1.meta["proxy"] == "http://u:pw-secret@127.0.0.1:1"
        assert r1.meta["download_slot"] == "proxy-1"
        # The lease is used up (2 uses) but r1, r2 are in flight: r3 waits.
        d3 = deferred_from_coro(_send(mw, "http://example.com/3"))
        assert not d3.called
        mw.process_response(r1, response(r1))
        assert not d3.called, "one request still in flight through proxy 1"
        mw.process_response(r2, response(r2))
        r3 = yield d3
        assert r3.meta["proxy_label"] == "http://127.0.0.1:2"
        assert r3.meta["download_slot"] == "proxy-2"
        assert crawler.stats.get_value("proxy/requests_waited") == 1
        assert crawler.stats.get_value("proxy/leases_released/rotated") == 1
        mw.process_response(r3, response(r3))
    finally:
        yield deferred_from_coro(mw.spider_closed())
    with open_proxies(url) as pool:
        rows = pool.usage()
        assert [(r.proxy_id, r.requests, r.end_reason) for r in rows] == [
            (1, 2, "rotated"),
            (2, 1, "released"),
        ]
        assert all(p.state != "leased" for p in pool.proxies())
    assert not any("pw-secret" in str(v) for v in crawler.stats.get_stats().values())
    assert not any("pw-secret" in k for k in crawler.stats.get_stats())


@pytest_twisted.inlineCallbacks
def test_ban_ends_lease_and_retries_through_another_proxy(tmp_path):
    mw, crawler, url = make_middleware(tmp_path, PROXY_ROTATE_EVERY=10, PROXY_MAX_BAN_RETRIES=1)
    try:
        r1 = yield deferred_from_coro(_send(mw, "http://example.com/1"))
        retry = mw.process_response(r1, response(r1, status=429))
        assert isinstance(retry, Request) and retry.meta["proxy_ban_retries"] == 1
        assert b"Proxy-Authorization" not in retry.headers
        yield deferred_from_coro(mw.process_request(retry))
        assert retry.meta["proxy_label"] == "http://127.0.0.1:2"
        # A second ban exhausts PROXY_MAX_BAN_RETRIES=1: the exception goes on.
        refused = mw.process_exception(retry, txerror.ConnectionRefusedError())
        assert (yield deferred_from_coro(refused)) is None
        assert crawler.stats.get_value("proxy/bans") == 2
        assert crawler.stats.get_value("proxy/ban_retries_exhausted") == 1
        assert crawler.stats.get_value("proxy/bans/status/429") == 1
    finally:
        yield deferred_from_coro(mw.spider_closed())
    with open_proxies(url) as pool:
        assert [r.end_reason for r in pool.usage()] == ["banned", "banned"]
        assert [p.state for p in pool.proxies()] == ["banned", "banned"]


@pytest_twisted.inlineCallbacks
def test_spider_decides_what_is_a_ban(tmp_path):
    mw, crawler, _ = make_middleware(tmp_path, BanSpider, PROXY_ROTATE_EVERY=10)
    try:
        r1 = yield deferred_from_coro(_send(mw, "http://example.com/1"))
        assert mw.process_response(r1, response(r1, status=403)).status == 403
        r2 = yield deferred_from_coro(_send(mw, "http://example.com/2"))
        ok_but_blocked = response(r2, body=b"<p>you are blocked</p>")
        assert isinstance(mw.process_response(r2, ok_but_blocked), Request)
        assert crawler.stats.get_value("proxy/bans") == 1
    finally:
        yield deferred_from_coro(mw.spider_closed())


@pytest_twisted.inlineCallbacks
def test_body_markers_and_timeouts_are_bans(tmp_path):
    mw, crawler, url = make_middleware(
        tmp_path, PROXY_ROTATE_EVERY=10, PROXY_BAN_BODY_MARKERS=["captcha"]
    )
    try:
        r0 = yield deferred_from_coro(_send(mw, "http://example.com/0"))
        assert mw.process_response(r0, response(r0, body=b"<p>fine</p>")).status == 200
        r1 = yield deferred_from_coro(_send(mw, "http://example.com/1"))
        failed = mw.process_exception(r1, ValueError("not the proxy's doing"))
        assert (yield deferred_from_coro(failed)) is None
        assert crawler.stats.get_value("proxy/bans") is None
        r2 = yield deferred_from_coro(_send(mw, "http://example.com/2"))
        retry = mw.process_response(r2, response(r2, body=b"<p>please solve the captcha</p>"))
        assert isinstance(retry, Request)
        yield deferred_from_coro(mw.process_request(retry))
        assert retry.meta["proxy_label"] == "http://127.0.0.1:2"
        again = yield deferred_from_coro(mw.process_exception(retry, TimeoutError()))
        assert isinstance(again, Request) and again.meta["proxy_ban_retries"] == 2
        assert crawler.stats.get_value("proxy/bans") == 2
        assert crawler.stats.get_value("proxy/bans/exception/TimeoutError") == 1
    finally:
        yield deferred_from_coro(mw.spider_closed())
    with open_proxies(url) as pool:
        assert [(r.requests, r.failures, r.end_reason) for r in pool.usage()] == [
            (3, 1, "banned"),
            (1, 1, "banned"),
        ]


class FaultySpider(Spider):
    name = "faulty"

    def response_is_ban(self, request, response):
        raise RuntimeError("the spider's own bug")


@pytest_twisted.inlineCallbacks
def test_giving_up_on_proxies_is_said_once_per_url(tmp_path, caplog):
    mw, crawler, url = make_middleware(tmp_path, PROXY_ROTATE_EVERY=10, PROXY_MAX_BAN_RETRIES=0)
    try:
        first = yield deferred_from_coro(_send(mw, "http://example.com/1"))
        refused = mw.process_exception(first, txerror.ConnectionRefusedError())
        assert (yield deferred_from_coro(refused)) is None
        # Scrapy's RetryMiddleware retries the failure with a copy of the request (its
        # meta too), which the second proxy's ban ends the same way.
        again = first.copy()
        yield deferred_from_coro(mw.process_request(again))
        refused = mw.process_exception(again, txerror.ConnectionRefusedError())
        assert (yield deferred_from_coro(refused)) is None
        assert crawler.stats.get_value("proxy/bans") == 2
        assert crawler.stats.get_value("proxy/ban_retries_exhausted") == 1
    finally:
        yield deferred_from_coro(mw.spider_closed())
    said = [r for r in caplog.records if r.getMessage().startswith("Gave up retrying")]
    assert len(said) == 1, [r.getMessage() for r in said]


@pytest_twisted.inlineCallbacks
def test_a_failing_ban_verdict_still_ends_the_attempt(tmp_path):
    mw, crawler, url = make_middleware(tmp_path, FaultySpider, PROXY_ROTATE_EVERY=1)
    try:
        r1 = yield deferred_from_coro(_send(mw, "http://example.com/1"))
        with pytest.raises(RuntimeError, match="own bug"):
            mw.process_response(r1, response(r1))
        assert mw.lease_for(r1) is None
        r2 = yield deferred_from_coro(_send(mw, "http://example.com/2"))
        assert r2.meta["proxy_label"] == "http://127.0.0.1:2", "the rotated lease was released"
        yield deferred_from_coro(mw.process_exception(r2, ValueError()))
    finally:
        yield deferred_from_coro(mw.spider_closed())
    with open_proxies(url) as pool:
        assert [(r.requests, r.end_reason) for r in pool.usage()] == [
            (1, "rotated"),
            (1, "rotated"),
        ]


@pytest_twisted.inlineCallbacks
def test_lease_for_names_a_requests_lease(tmp_path):
    mw, crawler, _ = make_middleware(tmp_path)
    try:
        direct = Request("http://example.com/direct", meta={"proxy_lease": False})
        yield deferred_from_coro(mw.process_request(direct))
        assert mw.lease_for(direct) is None and "proxy" not in direct.meta
        r1 = yield deferred_from_coro(_send(mw, "http://example.com/1"))
        lease = mw.lease_for(r1)
        assert (lease.proxy_id, lease.slot) == (1, "proxy-1")
        assert lease.label == "http://u:***@127.0.0.1:1" and "pw-secret" not in repr(lease)
        assert lease.proxy_url == r1.meta["proxy"] and lease.credentials == ("u", "pw-secret")
        assert lease.alive
        r2 = yield deferred_from_coro(_send(mw, "http://example.com/2"))
        assert mw.lease_for(r2).lease_id == lease.lease_id
        assert not lease.alive, "its second use (PROXY_ROTATE_EVERY=2) rotates it"
        mw.process_response(r1, response(r1))
        assert mw.lease_for(r1) is None, "the attempt is over"
        mw.process_response(r2, response(r2))
    finally:
        yield deferred_from_coro(mw.spider_closed())


@pytest_twisted.inlineCallbacks
def test_no_free_proxy_waits_and_is_counted(tmp_path, caplog):
    mw, crawler, url = make_middleware(tmp_path)
    other = ProxyPool(Hub.open(url))
    held = [other.acquire(Holder("elsewhere", 1), 60) for _ in range(2)]
    try:
        d = deferred_from_coro(_send(mw, "http://example.com/1"))
        for _ in range(600):  # until the hub said "none free" (bounded, not timed)
            if crawler.stats.get_value("proxy/requests_waited"):
                break
            yield deferLater(reactor, 0.05)
        assert not d.called
        other.release(held[0], "released")
        request = yield d  # picked up by the next poll of the hub
        assert request.meta["proxy_label"] == held[0].label
        assert crawler.stats.get_value("proxy/requests_waited") == 1
        assert crawler.stats.get_value("proxy/wait_seconds") > 0
        assert "No proxy free in the hub" in caplog.text
        mw.process_response(request, response(request))
    finally:
        other.release(held[1], "released")
        other.hub.close()
        yield deferred_from_coro(mw.spider_closed())


# --- a crawl through real proxies ---------------------------------------------------------------
OWN_SPIDER = """
import json, sys
from scrapy import Spider, Request
from scrapy.crawler import CrawlerProcess

class PagesSpider(Spider):
    name = "pages"
    def __init__(self, urls, out, **kw):
        super().__init__(**kw)
        self.urls, self.out = urls, open(out, "w")
    async def start(self):
        for url in open(self.urls).read().split():
            yield Request(url)
    def parse(self, response):
        self.out.write(json.dumps({"url": response.url, "status": response.status,
                                   "proxy": response.meta.get("proxy_label")}) + "\\n")
        self.out.flush()

settings = json.loads(sys.argv[1])
process = CrawlerProcess(settings)
process.crawl(PagesSpider, urls=sys.argv[2], out=sys.argv[3])
process.start()
"""

ROTATE_EVERY = 3
PAGES = 15


def crawl_settings(hub: str, log_file: Path) -> dict[str, object]:
    return {
        "HUB_URL": hub,
        "PROXY_ROTATE_EVERY": ROTATE_EVERY,
        "PROXY_LEASES_PER_PROCESS": 1,
        "PROXY_REST_SECONDS": 0,
        "PROXY_BAN_REST_SECONDS": 3600,
        "PROXY_MAX_BAN_RETRIES": 2,
        "CONCURRENT_REQUESTS": 1,
        "ROBOTSTXT_OBEY": False,
        "AUTOTHROTTLE_ENABLED": False,
        "DOWNLOAD_TIMEOUT": 60,
        "RETRY_ENABLED": False,
        "LOG_LEVEL": "DEBUG",
        "LOG_FILE": str(log_file),
    }


def run_site_crawl(tmp_path: Path, urls: Path, settings: dict[str, object]):
    data_dir = tmp_path / "data"
    args = [sys.executable, "-m", "scrapy", "crawl", "site", "-a", f"urls={urls}"]
    args += ["-s", f"DATA_DIR={data_dir}"]
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    done = launcher.run(
        args, cwd=ROOT, env=crawl_env(), capture_output=True, text=True, timeout=600
    )
    lines = [json.loads(line) for line in (data_dir / "fetch_log.jsonl").read_text().splitlines()]
    pages = [
        {"url": line["url"], "status": line["status"], "proxy": line.get("proxy")}
        for line in lines
        if line["outcome"] == "ok"
    ]
    return done, pages, [data_dir]


def run_own_crawl(tmp_path: Path, urls: Path, settings: dict[str, object]):
    out = tmp_path / "pages.jsonl"
    settings = {
        **settings,
        "DOWNLOADER_MIDDLEWARES": {"middlewares.proxy_lease.ProxyLeaseMiddleware": 740},
    }
    done = subprocess.run(
        [sys.executable, "-c", OWN_SPIDER, json.dumps(settings), str(urls), str(out)],
        cwd=ROOT,
        env=crawl_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    pages = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return done, pages, [out]


def crawl_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SCRAPY_SETTINGS_MODULE", "HUB_URL")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def file_texts(paths: list[Path]):
    """(path, text) of every file under the paths, gzip members decompressed."""
    for top in paths:
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
            raw = path.read_bytes()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            yield path, raw.decode("utf-8", errors="replace")


def test_crawl_through_the_pool(tmp_path, origin, proxy_pool):  # noqa: F811
    hub = f"sqlite:///{tmp_path}/hub.db"
    deny = proxy_pool["proxy-deny"]
    with open_proxies(hub) as pool:
        # The 403 proxy first, so the crawl's first lease is the one that gets banned.
        pool.add([deny.url])
        pool.add([proxy_pool["proxy-open"].url, proxy_pool["proxy-auth"].url])
    origin.reset()
    proxy_pool.mark()
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{origin.base}/page/{n}\n" for n in range(PAGES)))
    log_file = tmp_path / "crawl.log"
    settings = crawl_settings(hub, log_file)
    use_site = (ROOT / "spiders" / "site.py").exists()
    run = run_site_crawl if use_site else run_own_crawl
    done, pages, data = run(tmp_path, urls, settings)
    log = log_file.read_text() if log_file.exists() else ""
    assert done.returncode == 0, done.stderr[-3000:] + log[-3000:]

    # Every page arrived, through a proxy that works, even the one first sent to the 403 one.
    assert sorted(p["url"] for p in pages) == sorted(urls.read_text().split())
    assert {p["status"] for p in pages} == {200}
    good = {redact_url(proxy_pool["proxy-open"].url), redact_url(proxy_pool["proxy-auth"].url)}
    assert {p["proxy"] for p in pages} <= good

    # Every request reached the origin through a leased proxy (tinyproxy adds Via).
    hits = [h for h in origin.snapshot() if h.path.startswith("/page/")]
    assert len(hits) == PAGES
    vias = [h.via.split()[1] if h.via else "direct" for h in hits]
    assert set(vias) <= {"proxy-open", "proxy-auth"}, vias
    assert not any(h.proxy_authorization for h in hits)

    # The 403 proxy was asked once, banned, and rests; it forwarded nothing.
    assert len(deny.connections_since_mark()) == 1
    assert "Unauthorized connection" in deny.log_text()
    with open_proxies(hub) as pool:
        usage = pool.usage()
        proxies = {p.id: p for p in pool.proxies()}
        assert proxies[1].state == "banned" and proxies[1].resting_until > pool.hub.now()
    assert [(u.proxy_id, u.end_reason) for u in usage if u.proxy_id == 1] == [(1, "banned")]

    # Rotation every ROTATE_EVERY uses, as the proxies' own logs show.
    for proxy_id, name in ((2, "proxy-open"), (3, "proxy-auth")):
        rows = [u for u in usage if u.proxy_id == proxy_id]
        logged = proxy_pool[name].requests_since_mark()
        assert sum(u.requests for u in rows) == len(logged) > 0
        assert all(u.requests == ROTATE_EVERY for u in rows if u.end_reason == "rotated")
        assert all(u.end_reason in ("rotated", "released") for u in rows)
    runs = [len(list(group)) for _, group in groupby(vias)]
    assert max(runs) <= ROTATE_EVERY and len(runs) >= PAGES // ROTATE_EVERY, runs
    assert all(u.ended is not None for u in usage), "every lease released at the end"

    # Credentials appear nowhere: log, output, data files.
    for path, text in [(log_file, log), (Path("stdout"), done.stdout + done.stderr)] + list(
        file_texts(data)
    ):
        for secret in SECRETS:
            assert secret not in text, f"credentials in {path}"
    assert "proxy/leases_acquired" in log and "proxy/bans" in log


@pytest_twisted.inlineCallbacks
def test_heartbeat_renews_leases_and_reports_usage(tmp_path):
    mw, crawler, url = make_middleware(
        tmp_path, PROXY_LEASE_TTL=30, PROXY_HEARTBEAT_SECONDS=0.1, PROXY_ROTATE_EVERY=10
    )
    try:
        request = yield deferred_from_coro(_send(mw, "http://example.com/1"))
        mw.process_response(request, response(request, body=b"x" * 100))
        with open_proxies(url) as pool:
            first = pool.proxies()[0].lease_expires
        for _ in range(600):  # bounded: until two heartbeats went through
            if (crawler.stats.get_value("proxy/heartbeats") or 0) >= 2:
                break
            yield deferLater(reactor, 0.05)
        with open_proxies(url) as pool:
            proxy, usage = pool.proxies()[0], pool.usage()[0]
        assert proxy.state == "leased" and proxy.lease_expires > first
        assert (usage.requests, usage.bytes, usage.ended) == (1, 100, None)
        assert crawler.stats.get_value("proxy/leases_lost") is None
    finally:
        yield deferred_from_coro(mw.spider_closed())


# --- bans that heal -------------------------------------------------------------------------
def _actions(crawler) -> list[dict]:
    """What components send to the action log, as the archive would receive it."""
    sent: list[dict] = []
    crawler.signals.connect(lambda **kw: sent.append(kw), signal=crawler_signals.action, weak=False)
    return sent


@pytest_twisted.inlineCallbacks
def test_a_failure_bans_a_proxy_only_when_it_is_the_proxys(tmp_path, origin):  # noqa: F811
    """A timeout through a proxy that answers is the target's (no ban) until it happens
    for PROXY_BAN_FAILED_HOSTS hosts in a row; through a proxy that does not answer (a
    dead port) it is the proxy's at once, and the retry line says so."""
    answering = f"http://127.0.0.1:{origin.port}"  # accepts connections: a live proxy
    dead = f"http://127.0.0.1:{free_port()}"
    mw, crawler, url = make_middleware(
        tmp_path, proxies=[answering, dead], PROXY_ROTATE_EVERY=10, PROXY_BAN_FAILED_HOSTS=2
    )
    sent = _actions(crawler)
    timeout = DownloadTimeoutError("Getting http://a.example/1 took longer than 1.0 seconds")
    try:
        outcomes = []
        for target in ("http://a.example/1", "http://a.example/2", "http://c.example/ok"):
            request = yield deferred_from_coro(_send(mw, target))
            if target.endswith("/ok"):
                outcomes.append(mw.process_response(request, response(request)).status)
                continue
            outcomes.append((yield deferred_from_coro(mw.process_exception(request, timeout))))
        assert outcomes == [None, None, 200], "one host's timeouts are the host's"
        request = yield deferred_from_coro(_send(mw, "http://b.example/1"))
        assert (yield deferred_from_coro(mw.process_exception(request, timeout))) is None
        assert crawler.stats.get_value("proxy/target_failures/DownloadTimeoutError") == 3
        assert crawler.stats.get_value("proxy/bans") is None
        # A second host in a row with no answer between: the proxy is failing.
        request = yield deferred_from_coro(_send(mw, "http://d.example/1"))
        retry = yield deferred_from_coro(mw.process_exception(request, timeout))
        assert isinstance(retry, Request)
        # Through the dead proxy: its refusal is its own.
        yield deferred_from_coro(mw.process_request(retry))
        assert retry.meta["proxy_label"] == dead
        refused = DownloadConnectionRefusedError("Connection was refused by other side")
        again = yield deferred_from_coro(mw.process_exception(retry, refused))
        assert isinstance(again, Request)
        assert crawler.stats.get_value("proxy/down") == 1
        assert crawler.stats.get_value("proxy/bans") == 2
    finally:
        yield deferred_from_coro(mw.spider_closed())
    retries = [(a["proxy"], a["error"]) for a in sent if a["outcome"] == "retry"]
    assert [proxy for proxy, _ in retries] == [answering, dead]
    assert "is failing: DownloadTimeoutError for 2 different hosts" in retries[0][1]
    assert "is down" in retries[1][1] and "the proxy's failure, not the target's" in retries[1][1]
    with open_proxies(url) as pool:
        rows = {p.id: p for p in pool.proxies()}
        assert (rows[1].state, rows[1].failures) == ("banned", 4)
        assert (rows[2].state, rows[2].failures) == ("banned", 1)


@pytest_twisted.inlineCallbacks
def test_a_stall_is_logged_until_it_ends_and_unban_ends_it(tmp_path, hub_url, caplog):  # noqa: F811
    """No proxy free: the wait is logged every PROXY_WAIT_LOG_SECONDS for as long as it
    lasts, naming the proxy whose ban ends next; lifting the ban ends the stall."""
    mw, crawler, url = make_middleware(
        tmp_path, url=hub_url, PROXY_WAIT_LOG_SECONDS=0.2, PROXY_POLL_SECONDS=0.05
    )
    other = ProxyPool(Hub.open(url))
    held = other.acquire(Holder("elsewhere", 1), 60)
    banned = other.acquire(Holder("elsewhere", 1), 60)
    other.release(banned, "banned", UsageCounts(requests=1, bans=1), RestPolicy(jitter=0))
    try:
        caplog.set_level(logging.WARNING, logger="middlewares.proxy_lease")
        d = deferred_from_coro(_send(mw, "http://example.com/1"))
        for _ in range(600):  # bounded: until the wait was logged three times
            if (crawler.stats.get_value("proxy/wait_logs") or 0) >= 3:
                break
            yield deferLater(reactor, 0.05)
        waits = [r.getMessage() for r in caplog.records if "No proxy free" in r.getMessage()]
        assert len(waits) >= 3 and not d.called
        assert f"proxy #{banned.proxy_id}, banned until" in waits[-1]
        assert "1 of 2 enabled proxies leased" in waits[-1] and "proxies unban" in waits[-1]
        assert other.unban(banned.proxy_id) == [banned.proxy_id]
        request = yield d  # the next poll of the hub finds it
        assert request.meta["proxy_label"] == banned.label
        mw.process_response(request, response(request))
    finally:
        other.release(held, "released")
        other.hub.close()
        yield deferred_from_coro(mw.spider_closed())


SLOW_SECONDS = 4


@pytest.fixture(scope="module")
def healing_crawl(tmp_path_factory, origin, proxy_pool):  # noqa: F811
    """A crawl through a dead proxy (a port nothing listens on) and a live tinyproxy, of
    pages and of one page slower than DOWNLOAD_TIMEOUT."""
    tmp_path = tmp_path_factory.mktemp("healing")
    hub = f"sqlite:///{tmp_path}/hub.db"
    dead = f"http://127.0.0.1:{free_port()}"
    live = proxy_pool["proxy-open"].url
    with open_proxies(hub) as pool:
        pool.add([dead])  # leased first
        pool.add([live])
    urls = tmp_path / "urls.txt"
    pages = [f"{origin.base}/page/heal-{n}" for n in range(6)]
    slow = f"{origin.base}/slow/{SLOW_SECONDS}/1"
    urls.write_text("\n".join([pages[0], slow, *pages[1:]]) + "\n")
    log_file = tmp_path / "crawl.log"
    settings = {
        **crawl_settings(hub, log_file),
        "PROXY_ROTATE_EVERY": 100,
        # A ban would stall this one-proxy crawl for this long: long enough to be seen,
        # short enough that a crawl that bans wrongly still ends.
        "PROXY_BAN_REST_SECONDS": 20,
        "CONCURRENT_REQUESTS": 2,
        "DOWNLOAD_TIMEOUT": 1.5,
        "RETRY_ENABLED": True,
        "RETRY_TIMES": 1,
    }
    done, _, data = run_site_crawl(tmp_path, urls, settings)
    log = log_file.read_text() if log_file.exists() else ""
    assert done.returncode in (0, 1), done.stderr[-3000:] + log[-3000:]
    lines = [json.loads(line) for line in (data[0] / "fetch_log.jsonl").read_text().splitlines()]
    with open_proxies(hub) as pool:
        proxies = {redact_url(p.url): p for p in pool.proxies()}
    return {"dead": dead, "live": redact_url(live), "slow": slow, "pages": pages} | {
        "lines": lines,
        "proxies": proxies,
        "log": log,
    }


def test_a_proxy_that_serves_a_slow_page_stays_unbanned(healing_crawl):
    crawl = healing_crawl
    live = crawl["proxies"][crawl["live"]]
    assert (live.bans, live.consecutive_bans) == (0, 0) and live.state != "banned"
    slow = [
        line
        for line in crawl["lines"]
        if line["url"] == crawl["slow"] and line.get("proxy") == crawl["live"]
    ]
    assert [line["outcome"] for line in slow] == ["retry", "error"], crawl["lines"]
    assert all("TimeoutError" in line["error"] for line in slow)
    ok = {line["url"] for line in crawl["lines"] if line["outcome"] == "ok"}
    assert ok == set(crawl["pages"]), "every other page came through the same proxy"


def test_a_dead_proxys_refusal_is_counted_as_the_proxys(healing_crawl):
    crawl = healing_crawl
    dead = crawl["proxies"][crawl["dead"]]
    blamed = [line for line in crawl["lines"] if line.get("proxy") == crawl["dead"]]
    # Each request in flight through it when it failed: one failure and one ban each.
    assert dead.state == "banned" and dead.bans == dead.failures == len(blamed) >= 1
    assert {line["outcome"] for line in blamed} == {"retry"}
    assert all(
        "is down" in line["error"] and "not the target's" in line["error"] for line in blamed
    )
    assert "is down: DownloadConnectionRefusedError" in crawl["log"]
    assert f"'proxy/down': {len(blamed)}" in crawl["log"]
    # The targets are not blamed: their pages came through the other proxy.
    for line in blamed:
        retried = [x for x in crawl["lines"] if x["url"] == line["url"] and x is not line]
        assert retried and all(x.get("proxy") == crawl["live"] for x in retried)
        assert line["url"] == crawl["slow"] or [x["outcome"] for x in retried] == ["ok"]
