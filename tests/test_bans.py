"""Bans by body marker, by timeout and by refused connection, through real
tinyproxies to a real origin.

The origin tells proxies apart by the Via header each tinyproxy adds: through
``ban-marker`` it answers 200 with a block page, through ``ban-hang`` it never answers
(until the test ends), through ``ban-good`` it serves the page. The hub leases the bad
proxy first, so the first request is banned there and must come through the good one.
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from tests import launcher
from tests.checks import actions, rows_by_url
from tests.conftest import ROOT, crawl_command, crawl_env
from tests.proxy_servers import TinyProxy
from tests.servers import free_port, need

BLOCK_PAGE = b"<html><body><p>Access denied: unusual traffic</p></body></html>"
PAGES = 5


def page(path: str) -> bytes:
    return f"<html><body><p>{path}</p></body></html>".encode()


class BanningOrigin:
    def __init__(self) -> None:
        self.hits: Counter[tuple[str, str]] = Counter()  # (proxy name, path)
        self.gate = threading.Event()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                via = (self.headers.get("Via") or "direct").split()
                name = via[1] if len(via) > 1 else via[0]
                origin.hits[(name, self.path)] += 1
                if name == "ban-hang":
                    origin.gate.wait(600)  # answered only once the test is over
                body = BLOCK_PAGE if name == "ban-marker" else page(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def banning(tmp_path):
    if shutil.which("tinyproxy") is None:
        need("tinyproxy is not installed (Debian: apt-get install tinyproxy)")
    origin = BanningOrigin()
    proxies = [TinyProxy(name, tmp_path) for name in ("ban-marker", "ban-hang", "ban-good")]
    try:
        for proxy in proxies:
            proxy.start()
        yield origin, {p.name: p for p in proxies}
    finally:
        for proxy in proxies:
            proxy.stop()
        origin.stop()


def proxies_command(hub_url: str, *args: str) -> str:
    env = {k: v for k, v in crawl_env().items() if k != "HUB_URL"}
    env["HUB_URL"] = hub_url
    done = launcher.run([sys.executable, "-m", "scrapy", "proxies", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def states(listing: str) -> dict[str, str]:
    """Proxy URL -> state, from `scrapy proxies list`."""
    header, _, *rows = listing.splitlines()
    assert header.split()[1:3] == ["proxy", "state"]
    return {row.split()[1]: row.split()[2] for row in rows}


def crawl_through(tmp_path, origin, proxy_urls: list[str], **settings):
    """Crawl PAGES pages of the origin through the proxies, leased in the given order."""
    hub_url = f"sqlite:///{tmp_path}/hub.db"
    for url in proxy_urls:  # one at a time: the hub leases never-used proxies by id
        proxies_command(hub_url, "add", url)
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{origin.base}/page/{n}\n" for n in range(PAGES)))
    data_dir = tmp_path / "data"
    settings = {
        "HUB_URL": hub_url,
        "PROXY_LEASES_PER_PROCESS": 1,
        "PROXY_ROTATE_EVERY": 100,
        "PROXY_REST_SECONDS": 0,
        "PROXY_BAN_REST_SECONDS": 3600,
        "CONCURRENT_REQUESTS": 1,
        "ROBOTSTXT_OBEY": 0,
        "RETRY_ENABLED": 0,  # a request goes on only by the ban's own retry
        **settings,
    }
    args = [arg for key, value in settings.items() for arg in ("-s", f"{key}={value}")]
    env = {k: v for k, v in crawl_env().items() if k != "HUB_URL"}
    done = launcher.run(crawl_command(urls, data_dir, *args), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr, data_dir, states(proxies_command(hub_url, "list"))


def assert_all_pages_came_through(origin, data_dir, good) -> None:
    rows = rows_by_url(data_dir)
    assert set(rows) == {f"{origin.base}/page/{n}" for n in range(PAGES)}
    assert all(r.bytes == len(page(urlsplit(u).path)) for u, r in rows.items()), "a block page"
    assert {path: n for (name, path), n in origin.hits.items() if name == good.name} == {
        f"/page/{n}": 1 for n in range(PAGES)
    }
    assert {e["proxy"] for e in actions(data_dir) if e["outcome"] == "ok"} == {good.url}


def test_a_block_page_bans_its_proxy(banning, tmp_path):
    origin, proxies = banning
    marker, good = proxies["ban-marker"], proxies["ban-good"]
    log, data_dir, listing = crawl_through(
        tmp_path, origin, [marker.url, good.url], PROXY_BAN_BODY_MARKERS="Access denied"
    )
    assert [path for (name, path) in origin.hits if name == marker.name] == ["/page/0"]
    assert_all_pages_came_through(origin, data_dir, good)
    assert "'proxy/bans': 1" in log and "'proxy/bans/status/200': 1" in log
    assert listing == {marker.url: "banned", good.url: "free"}


def test_a_timeout_bans_its_proxy_when_one_host_is_enough(banning, tmp_path):
    origin, proxies = banning
    hang, good = proxies["ban-hang"], proxies["ban-good"]
    # The origin never answers through ban-hang: the download times out. The proxy
    # answers a probe, so by default only timeouts at PROXY_BAN_FAILED_HOSTS hosts
    # would ban it (one host timing out is the host's fault: tests/test_proxy_lease.py);
    # this crawl has one host, and says one is enough.
    log, data_dir, listing = crawl_through(tmp_path, origin, [hang.url, good.url],
                                           DOWNLOAD_TIMEOUT=2,
                                           PROXY_BAN_FAILED_HOSTS=1)  # fmt: skip
    assert [path for (name, path) in origin.hits if name == hang.name] == ["/page/0"]
    assert_all_pages_came_through(origin, data_dir, good)
    assert "'proxy/bans': 1" in log
    assert listing == {hang.url: "banned", good.url: "free"}


def test_a_refused_connection_bans_its_proxy(banning, tmp_path):
    origin, proxies = banning
    good = proxies["ban-good"]
    refusing = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    log, data_dir, listing = crawl_through(tmp_path, origin, [refusing, good.url])
    assert_all_pages_came_through(origin, data_dir, good)
    assert "'proxy/bans': 1" in log
    assert listing == {refusing: "banned", good.url: "free"}


class BrokenProxy:
    """A proxy that accepts every connection and then resets it (``reset``) or never
    answers (``stall``): a TCP probe finds it alive, every request through it fails."""

    def __init__(self, mode: str) -> None:
        import socket
        import struct

        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list = []
        self._linger = struct.pack("ii", 1, 0)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.mode == "stall":
                self.held.append(conn)
                continue
            conn.recv(65536)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, self._linger)
            conn.close()

    def stop(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_proxies_that_reset_or_stall_are_banned_on_a_one_host_crawl(banning, tmp_path):
    """A pool of a proxy that resets every connection, one that never answers and a good
    one, all leased at once, one host: the two broken ones are banned (they answer a
    probe, but fail where the good one gets answers) and every page is stored."""
    origin, proxies = banning
    broken = [BrokenProxy("reset"), BrokenProxy("stall")]
    try:
        _, data_dir, listed = crawl_through(
            tmp_path,
            origin,
            [broken[0].url, broken[1].url, proxies["ban-good"].url],
            PROXY_LEASES_PER_PROCESS=3,
            CONCURRENT_REQUESTS=3,
            RETRY_ENABLED=1,
            RETRY_TIMES=8,  # a retry may meet a broken proxy before its ban (loaded machines)
            DOWNLOAD_TIMEOUT=4,
        )
    finally:
        for proxy in broken:
            proxy.stop()
    assert listed[broken[0].url] == "banned" and listed[broken[1].url] == "banned", listed
    assert set(rows_by_url(data_dir)) == {f"{origin.base}/page/{n}" for n in range(PAGES)}


def test_sigint_while_the_only_proxy_rests_and_the_rerun_takes_it_at_once(banning, tmp_path):
    """The only proxy rests an hour after its stretch: Ctrl-C ends the crawl in seconds
    (exit 75), and its rerun takes the proxy whose rest its own crawl caused instead of
    waiting the hour out, and stores the rest."""
    from tests.test_hub_day import STOP_WITHIN, interrupt

    origin, proxies = banning
    good = proxies["ban-good"]
    hub_url = f"sqlite:///{tmp_path}/hub.db"
    proxies_command(hub_url, "add", good.url)
    pages = 8
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{origin.base}/page/{n}\n" for n in range(pages)))
    settings = {
        "HUB_URL": hub_url,
        "PROXY_LEASES_PER_PROCESS": 1,
        "PROXY_ROTATE_EVERY": 5,
        "PROXY_REST_SECONDS": 3600,
        "PROXY_REST_JITTER": 0,
        "CONCURRENT_REQUESTS": 1,
        "ROBOTSTXT_OBEY": 0,
    }
    args = [arg for key, value in settings.items() for arg in ("-s", f"{key}={value}")]
    env = {k: v for k, v in crawl_env().items() if k != "HUB_URL"}
    data_dir, log = tmp_path / "data", tmp_path / "crawl.log"
    proc = launcher.start(crawl_command(urls, data_dir, *args), log=log, cwd=ROOT, env=env,
                          new_session=True)  # fmt: skip

    def resting() -> bool:
        return sum(n for (name, _), n in origin.hits.items() if name == good.name) >= 5

    took = interrupt(proc, resting, log)
    assert took < STOP_WITHIN, took
    assert "resting" in proxies_command(hub_url, "list")
    first = set(rows_by_url(data_dir))
    assert len(first) == 5, sorted(first)
    done = launcher.run(crawl_command(urls, data_dir, *args), cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(rows_by_url(data_dir)) == {f"{origin.base}/page/{n}" for n in range(pages)}
