"""Input a user really has: cookies, IPv6 literals, bad settings."""

from __future__ import annotations

import os
import socket

import pytest
from scrapy.exceptions import UsageError
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.checks import catalog_rows
from tests.conftest import crawl_env, run_crawl, write_urls
from tests.crawls import OnePage, crawl, crawl_site
from tests.rawserver import RawServer, response
from tests.servers import need

# Records every connection (and name lookup) to a host other than the loopback, then
# refuses it, so a component that reaches out cannot hang the crawl either.
AUDIT = """
import sys

def _hook(event, args):
    if event == "socket.connect":
        host = args[1][0] if isinstance(args[1], tuple) else None
    elif event == "socket.getaddrinfo":
        host = args[0]
    else:
        return
    if isinstance(host, bytes):
        host = host.decode()
    if host is not None and host not in ("127.0.0.1", "::1", "localhost"):
        with open(%r, "a") as f:
            f.write(f"{event} {host}\\n")
        raise OSError("outside connection refused by the test")

sys.addaudithook(_hook)
"""


def test_a_cookie_makes_no_connection_outside_the_crawl(tmp_path, data_dir):
    server = RawServer(
        {"/c": response(headers=[(b"Set-Cookie", b"a=1; Domain=127.0.0.1; Path=/")], body=b"hi")}
    )
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    outside = tmp_path / "outside.txt"
    (hooks / "sitecustomize.py").write_text(AUDIT % str(outside))
    env = crawl_env()
    env["PYTHONPATH"] = f"{hooks}{os.pathsep}{env['PYTHONPATH']}"
    # An empty cache: tldextract has no suffix list but what it ships or downloads.
    env["TLDEXTRACT_CACHE"] = str(tmp_path / "tldcache")
    env.pop("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", None)
    urls = write_urls(tmp_path / "u.txt", [server.url("/c"), server.url("/c?again")])
    result = run_crawl(urls, data_dir, "-s", "ROBOTSTXT_OBEY=0", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not outside.exists(), outside.read_text()
    assert len(catalog_rows(data_dir)) == 2


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("CATALOG_BATCH_SIZE=0", "CATALOG_BATCH_SIZE"),
        ("CATALOG_BATCH_SIZE=abc", "CATALOG_BATCH_SIZE"),
        ("ARCHIVE_FORMAT=tar", "ARCHIVE_FORMAT"),
        ("ARCHIVE_COMPRESSOR=bz2", "ARCHIVE_COMPRESSOR"),
        ("ARCHIVE_GZIP_LEVEL=99", "ARCHIVE_GZIP_LEVEL"),
    ],
)
@deferred_f_from_coro_f
async def test_a_bad_setting_is_a_usage_error_naming_it(data_dir, setting, named):
    """A usage error is what ``scrapy crawl`` prints as one line and exits 2 for
    (the test below, which also has the bad hub URLs: refused as the engine is built,
    after the archive writer process started, which only the process's end stops)."""
    name, value = setting.split("=", 1)
    with pytest.raises(UsageError) as refused:
        await crawl(OnePage, data_dir, {name: value}, url="http://127.0.0.1:9/")
    message = str(refused.value)
    assert named in message and "\n" not in message
    assert "secret" not in message


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("CATALOG_BATCH_SIZE=abc", "CATALOG_BATCH_SIZE"),
        ("HUB_URL=bogus://hub", "HUB_URL"),
        ("HUB_URL=postgresql://me:secret@[db:5432/crawl", "HUB_URL"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it_and_exit_2(tmp_path, data_dir, setting, named):
    urls = write_urls(tmp_path / "u.txt", ["http://127.0.0.1:9/"])
    result = run_crawl(urls, data_dir, "-s", setting, "-s", "LOG_LEVEL=WARNING")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and named in lines[0]
    assert "secret" not in lines[0]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@deferred_f_from_coro_f
async def test_an_ipv6_literal_is_fetched(data_dir):
    if not _ipv6_loopback():
        need("this machine has no IPv6 loopback (::1)")
    server = RawServer({"/six": response(body=b"over IPv6")}, host="::1")
    await crawl_site([server.url("/six")], data_dir, {"ROBOTSTXT_OBEY": "0"})
    assert server.counts["/six"] == 1
    [row] = catalog_rows(data_dir).values()
    assert (row.url, row.status) == (server.url("/six"), 200)
