"""Registered domains: a depth crawl follows links within ``bbc.co.uk``, not ``co.uk``.

The function is checked on names, then a crawl is run over several host names that
all reach one server on 127.0.0.1. The names are mapped by Scrapy's own
``TWISTED_DNS_RESOLVER`` setting (tests/loopback_resolver.py) rather than by sending
everything through a proxy: the request goes to the host named in the URL, with its
Host header, exactly as in a crawl of real sites, and a link the spider should not
follow would be fetched and show up, since every name of the test resolves.
"""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from crawler.domains import registered_domain
from tests.checks import rows_by_url
from tests.conftest import run_crawl, write_urls


@pytest.mark.parametrize(
    ("host", "domain"),
    [
        ("www.bbc.co.uk", "bbc.co.uk"),
        ("bbc.co.uk", "bbc.co.uk"),
        ("news.bbc.co.uk", "bbc.co.uk"),
        ("WWW.BBC.CO.UK.", "bbc.co.uk"),
        ("a.b.example.com.au", "example.com.au"),
        ("www.example.com", "example.com"),
        # An exception rule of the suffix list: *.kawasaki.jp, but !city.kawasaki.jp.
        ("www.city.kawasaki.jp", "city.kawasaki.jp"),
        ("www.foo.kawasaki.jp", "www.foo.kawasaki.jp"),
        # No registered domain: the host stands for itself.
        ("co.uk", "co.uk"),
        ("127.0.0.1", "127.0.0.1"),
        ("localhost", "localhost"),
    ],
)
def test_registered_domain_of_names(host, domain):
    assert registered_domain(host) == domain


def test_other_hosts_of_a_public_suffix_are_other_domains():
    assert registered_domain("other.co.uk") != registered_domain("www.bbc.co.uk")
    assert registered_domain("bbc.com") != registered_domain("bbc.co.uk")


HOSTS = {
    "www.example.co.uk": True,  # listed
    "shop.example.co.uk": True,  # same registered domain
    "deep.shop.example.co.uk": True,
    "example.co.uk": True,
    "other.co.uk": False,  # shares only the public suffix co.uk
    "example.com": False,  # the same name under another suffix
    "www.example.org.uk": False,  # org.uk is a suffix of its own
}


class NamedHosts:
    """One server answering for every name of HOSTS; counts requests per (host, path)."""

    def __init__(self) -> None:
        self.hits: Counter[tuple[str, str]] = Counter()
        named = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
                named.hits[(host, self.path)] += 1
                if self.path == "/robots.txt":
                    self.answer(404, b"")
                    return
                links = "".join(
                    f"<a href='http://{name}:{named.port}/from-{host}'>{name}</a>" for name in HOSTS
                )
                self.answer(200, f"<html><body>{links}</body></html>".encode())

            def answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def named_hosts():
    server = NamedHosts()
    yield server
    server.stop()


def test_depth_crawl_follows_the_registered_domain_not_the_suffix(named_hosts, tmp_path):
    start = f"http://www.example.co.uk:{named_hosts.port}/"
    resolver = (
        "-s", "TWISTED_DNS_RESOLVER=tests.loopback_resolver.LoopbackResolver",
        "-s", f"LOOPBACK_HOSTS={','.join(HOSTS)}",
    )  # fmt: skip
    data_dir = tmp_path / "data"
    result = run_crawl(write_urls(tmp_path / "urls.txt", [start]), data_dir, "-a", "depth=2",
                       *resolver)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    inside = [host for host, followed in HOSTS.items() if followed]
    # Not one request, robots.txt included, went to a host outside example.co.uk.
    assert {host for host, _ in named_hosts.hits} == set(inside)
    port = named_hosts.port
    expected = {start} | {f"http://{n}:{port}/from-{h}" for n in inside for h in inside}
    assert set(rows_by_url(data_dir)) == expected
