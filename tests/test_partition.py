"""Who fetches a URL: the partition unit of a URL by mode, and shards that take units
whole, so that one crawl process fetches every URL of a site; a list crawled in
2 shards and resumed in 3 fetches nothing twice."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from scrapy.exceptions import UsageError
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.partition import (
    PartitionError,
    check_mode,
    partition_unit,
    shard_of,
    stable_hash,
)
from crawler.spiderkit.urls import in_shard
from crawler.storage.keys import request_key
from tests.checks import rows_by_url
from tests.conftest import ROOT, run_crawl, write_urls
from tests.crawls import crawl_site
from tests.hostservers import HostServers

URLS = [
    "http://www.bbc.co.uk/news/1",
    "https://news.BBC.co.uk:8443/2",
    "http://bbc.co.uk./3",
    "http://other.co.uk/4",
    "http://127.0.0.1:8000/5",
    "http://[::1]:8080/6",
]


def test_the_unit_of_a_url_by_mode():
    assert [partition_unit(u, "domain") for u in URLS] == [
        "bbc.co.uk", "bbc.co.uk", "bbc.co.uk", "other.co.uk", "127.0.0.1", "::1",
    ]  # fmt: skip
    assert [partition_unit(u, "host") for u in URLS] == [
        "www.bbc.co.uk", "news.bbc.co.uk", "bbc.co.uk", "other.co.uk", "127.0.0.1", "::1",
    ]  # fmt: skip
    assert [partition_unit(u, "url") for u in URLS] == [request_key(u) for u in URLS]


def test_the_hash_is_the_same_in_every_process():
    # Python's hash() of a string differs per process: shards would not agree.
    code = "from crawler.partition import stable_hash; print(stable_hash('bbc.co.uk'))"
    other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, check=True, env={"PYTHONHASHSEED": "random"})  # fmt: skip
    assert int(other.stdout) == stable_hash("bbc.co.uk") == 9755168957875053428


def test_shards_take_units_whole_and_url_mode_splits_by_key():
    urls = [f"http://h{n % 13}.site{n % 5}.com/p/{n}" for n in range(400)]
    for count in (1, 2, 3, 7):
        for mode, unit_of in (
            ("domain", lambda u: u.split("/")[2].split(".", 1)[1]),
            ("host", lambda u: u.split("/")[2]),
        ):
            shards: dict[str, set[int]] = {}
            for url in urls:
                shards.setdefault(unit_of(url), set()).add(
                    shard_of(url, request_key(url), mode, count)
                )
            assert all(len(s) == 1 for s in shards.values()), (mode, count)
        # url: the split of earlier versions, by the request key.
        for url in urls:
            key = request_key(url)
            mine = shard_of(url, key, "url", count)
            assert [i for i in range(count) if in_shard(key, (i, count))] == [mine]
    hosts = {shard_of(u, request_key(u), "host", 7) for u in urls}
    domains = {shard_of(u, request_key(u), "domain", 7) for u in urls}
    assert len(hosts) > len(domains) > 1  # 65 hosts spread wider than 5 domains


def test_a_mode_that_is_not_one_is_named_with_where_it_came_from():
    assert check_mode(None) == "domain" and check_mode(" HOST ") == "host"
    with pytest.raises(PartitionError, match=r"-a partition: 'site' is not a partition mode; "
                       r"give one of domain, host, url"):  # fmt: skip
        check_mode("site", "-a partition")


def test_a_crawl_refuses_a_bad_partition_argument(tmp_path):
    urls = write_urls(tmp_path / "urls.txt", ["http://127.0.0.1:1/"])
    result = run_crawl(urls, tmp_path / "data", "-a", "shard=0/2", "-a", "partition=site")
    assert result.returncode == 2
    assert "-a partition: 'site' is not a partition mode" in result.stderr


@deferred_f_from_coro_f
async def test_a_bad_partition_setting_stops_the_crawl_before_it_starts(tmp_path):
    with pytest.raises(UsageError, match="CRAWL_PARTITION: 'sites' is not a partition mode"):
        await crawl_site(["http://127.0.0.1:1/"], tmp_path / "data", {"CRAWL_PARTITION": "sites"})


HOSTS = ["www.alpha.co.uk", "shop.alpha.co.uk", "beta.example.com", "gamma.example.org",
         "www.delta.net", "cdn.delta.net"]  # fmt: skip


def domain_of(host: str) -> str:
    return ".".join(host.split(".")[-3:] if host.endswith(".co.uk") else host.split(".")[-2:])


@deferred_f_from_coro_f
async def test_shards_by_domain_keep_a_site_in_one_crawl_and_resume_with_another_count(
    tmp_path,
):
    with HostServers(HOSTS, latency=0) as hosts, hosts.resolving():
        urls = [url for host in HOSTS for url in hosts.urls(host, 6)]
        url_file = write_urls(tmp_path / "urls.txt", urls)
        settings = hosts.settings()
        # Half of a 2-way split, as a task that was stopped, then the whole list 3 ways.
        await crawl_site(url_file, tmp_path / "two0", settings, shard="0/2")
        first = set(rows_by_url(tmp_path / "two0"))
        settings["CATALOG_SEEN"] = f"{tmp_path}/two0/metadata.db"
        for i in range(3):
            await crawl_site(url_file, tmp_path / f"three{i}", settings, shard=f"{i}/3")
        stored = Counter()
        sites_of = {}  # data dir -> registered domains it fetched
        for name in ("two0", "three0", "three1", "three2"):
            rows = rows_by_url(tmp_path / name)
            stored.update(list(rows))
            sites_of[name] = {domain_of(url.split("/")[2].split(":")[0]) for url in rows}
        assert 0 < len(first) < len(urls)
        assert stored == Counter(urls)  # every URL stored once, over both splits
        for server in hosts:
            pages = [r.path for r in server.log() if r.path != "/robots.txt"]
            assert Counter(pages) == Counter(f"/page/{n}.html" for n in range(6)), server.name
        # Each site went to one crawl of each split: both hosts of alpha.co.uk and of
        # delta.net together.
        for split in (["two0"], ["three0", "three1", "three2"]):
            owners = Counter(d for name in split for d in sites_of[name])
            assert set(owners.values()) == {1}, sites_of
        assert sum(len(sites_of[f"three{i}"]) for i in range(3)) == 4 - len(sites_of["two0"])
