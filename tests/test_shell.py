"""``scrapy shell`` and offline replay through the archive-backed HTTP cache storage."""

from __future__ import annotations

import hashlib

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from demo.site import DemoSite
from tests.checks import rows_by_url
from tests.cmdline import canon, read_jsonl, run_scrapy
from tests.crawls import crawl_site

PROBE = (
    "' '.join(map(str, ['RESULT', response.status, type(response).__name__, "
    "'cached' in response.flags, __import__('hashlib').sha256(response.body).hexdigest(), "
    "response.url]))"
)


def probe(url: str, data_dir, *settings: str):
    result = run_scrapy("shell", url, "-s", f"DATA_DIR={data_dir}", *settings, "-c", PROBE)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    return result, (lines[0].split()[1:] if lines else None)


@pytest.fixture
def own_site():
    """A server of this test's own, so that it can be stopped."""
    demo = DemoSite(pages=50, page_bytes=2000, seed=7)
    demo.start()
    yield demo
    demo.stop()


@pytest.mark.parametrize("fmt", ["warc", "sqlite"])
@deferred_f_from_coro_f
async def test_shell_answers_from_the_archive_with_the_server_stopped(own_site, data_dir, fmt):
    base = own_site.base_url
    urls = [f"{base}/page/5.html", f"{base}/redirect/6"]
    await crawl_site(urls, data_dir, {"ARCHIVE_FORMAT": fmt})
    own_site.stop()
    expected = hashlib.sha256(own_site.payload("/page/5.html")).hexdigest()
    result, found = probe(f"{base}/page/5.html", data_dir)
    assert found == ["200", "HtmlResponse", "True", expected, f"{base}/page/5.html"], result.stderr
    # The redirect as the crawl saw it: the final page, under its final URL.
    result, found = probe(f"{base}/redirect/6", data_dir, "-s", "ARCHIVE_SHELL=offline")
    assert found is not None, result.stderr
    assert found[0] == "200" and found[4] == f"{base}/page/6.html"
    assert "archive_hit" in result.stderr or found[2] == "True"


def said(result) -> str:
    """The shell's one line on where its response comes from."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("http")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_shell_fetches_and_stores_what_is_not_stored_and_says_so(own_site, data_dir):
    url = f"{own_site.base_url}/page/8.html"
    result, found = probe(url, data_dir)
    assert found is not None and found[2] == "False", result.stderr
    assert own_site.counts["/page/8.html"] == 1
    assert url in rows_by_url(data_dir)  # stored, like a crawl would
    assert said(result) == (
        f"{url}: not stored; fetched from the network and stored in {data_dir}, as a crawl "
        "would (-s ARCHIVE_SHELL=offline never fetches)"
    )
    result, found = probe(url, data_dir)
    assert found is not None and found[2] == "True", result.stderr
    assert own_site.counts["/page/8.html"] == 1  # the second time came from the archive
    assert (
        said(result) == f"{url}: stored in {data_dir}, answered from the archive (nothing is sent)"
    )
    result, found = probe(url, data_dir, "-s", "ARCHIVE_SHELL=live")
    assert found is not None and found[2] == "False", result.stderr
    assert own_site.counts["/page/8.html"] == 2
    assert said(result) == f"{url}: fetched from the network, not stored (ARCHIVE_SHELL=live)"


@deferred_f_from_coro_f
async def test_offline_shell_says_an_unstored_url_is_not_in_the_catalog(own_site, data_dir):
    await crawl_site([f"{own_site.base_url}/page/3.html"], data_dir)
    url = f"{own_site.base_url}/page/4.html"
    result, found = probe(url, data_dir, "-s", "ARCHIVE_SHELL=offline")
    assert found is None and result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert f"{url} is not in the catalog" in line and "scrapy shell URL" in line
    assert "Traceback" not in result.stderr
    assert own_site.counts["/page/4.html"] == 0


def test_bad_archive_shell_mode_is_a_usage_error(data_dir):
    result = run_scrapy("shell", "http://127.0.0.1:9/", "-s", "ARCHIVE_SHELL=sometimes", "-c", "1")
    assert result.returncode == 2
    assert "ARCHIVE_SHELL='sometimes': give one of archive, offline, live" in result.stderr


@deferred_f_from_coro_f
async def test_a_crawl_replays_offline_from_the_archive(own_site, tmp_path, data_dir):
    urls = [f"{own_site.base_url}/page/{n}.html" for n in range(10, 16)]
    live = {"FEEDS": {str(tmp_path / "live.jsonl"): {"format": "jsonl"}}}
    await crawl_site(urls, data_dir, live)
    own_site.stop()
    settings = {
        "FEEDS": {str(tmp_path / "replay.jsonl"): {"format": "jsonl"}},
        "HTTPCACHE_ENABLED": "1",
        "HTTPCACHE_STORAGE": "extensions.archive_cache.ArchiveCacheStorage",
        "HTTPCACHE_IGNORE_MISSING": "1",
        "ARCHIVE_ENABLED": "0",
        "ROBOTSTXT_OBEY": "0",
    }
    replay = await crawl_site(urls, data_dir, settings)
    assert replay.stats.get_value("httpcache/archive_hit") == 6
    assert canon(read_jsonl(tmp_path / "replay.jsonl")) == canon(
        read_jsonl(tmp_path / "live.jsonl")
    )
