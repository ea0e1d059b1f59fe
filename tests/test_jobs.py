"""Jobs in the hub (crawler/hub/jobs.py, ``scrapy job``), and a crawl that follows its
job's settings as they change."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from crawler.admin import JobAdmin
from crawler.hub import Hub, ProxyPool
from crawler.hub.jobs import JobError, JobStore, parse_assignments
from spiders.site import SiteSpider
from tests.conftest import start_crawl, write_urls
from tests.crawls import crawl
from tests.events import wait_for_log
from tests.hubs import hub_url, scrapy_with_hub  # noqa: F401 - hub_url: a fixture
from tests.proxy_servers import TinyProxy
from tests.servers import need


def test_jobs_are_created_once_and_changed_by_version(hub_url):  # noqa: F811
    with Hub.open(hub_url) as hub:
        store = JobStore(hub)
        job = store.create("j", "site", {"CONCURRENT_REQUESTS": "4"}, queue="j")
        assert (job.version, job.settings, job.queue) == (1, {"CONCURRENT_REQUESTS": "4"}, "j")
        with pytest.raises(JobError, match="exists"):
            store.create("j", "site", {})
        assert store.newer("j", 1) is None
        changed = store.set("j", {"DOWNLOAD_DELAY": "0.5", "CONCURRENT_REQUESTS": "2"})
        assert changed.version == 2
        assert changed.settings == {"CONCURRENT_REQUESTS": "2", "DOWNLOAD_DELAY": "0.5"}
        assert store.newer("j", 1) == changed
        assert [j.name for j in store.jobs()] == ["j"]
        with pytest.raises(JobError, match="no job 'other'.*scrapy job create"):
            store.set("other", {"A": "1"})


def test_assignments_name_the_malformed_one():
    assert parse_assignments(["A=1", "B_C=x=y", "D="]) == {"A": "1", "B_C": "x=y", "D": ""}
    for bad in ("novalue", "=1", "lower=1"):
        with pytest.raises(JobError, match=f"{bad!r} is not a setting"):
            parse_assignments([bad])


def test_job_commands(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    urls = write_urls(tmp_path / "urls.txt", ["http://example.org/1", "http://example.org/2"])
    created = scrapy_with_hub(
        "job", "create", "crawl1", "--spider", "site", "-s", "CONCURRENT_REQUESTS=4",
        "--urls", str(urls), hub=hub,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "2 URLs added" in created.stdout and "CONCURRENT_REQUESTS=4" in created.stdout
    changed = scrapy_with_hub("job", "set", "crawl1", "DOWNLOAD_DELAY=1", hub=hub)
    assert changed.returncode == 0 and "version 2: DOWNLOAD_DELAY=1" in changed.stdout
    listed = scrapy_with_hub("job", "list", hub=hub)
    assert "crawl1: spider site, queue 'crawl1': done 0/2" in listed.stdout
    shown = scrapy_with_hub("job", "show", "crawl1", hub=hub)
    assert "CONCURRENT_REQUESTS=4, DOWNLOAD_DELAY=1" in shown.stdout
    missing = scrapy_with_hub("job", "show", "nope", hub=hub)
    assert missing.returncode == 1 and "no job 'nope'" in missing.stderr
    usage = scrapy_with_hub("job", "create", "x", hub=hub)
    assert usage.returncode == 2 and "--spider" in usage.stderr


MARKER = "Demo page number"  # in every page of the demo site


def test_a_running_crawl_follows_its_jobs_settings(site, tmp_path, data_dir):
    if shutil.which("tinyproxy") is None:
        need("tinyproxy is not installed (Debian: apt-get install tinyproxy)")
    (tmp_path / "proxies").mkdir()
    proxies = [TinyProxy(f"job-{n}", tmp_path / "proxies") for n in range(2)]
    hub = f"sqlite:///{tmp_path}/hub.db"
    job_settings = {
        "CONCURRENT_REQUESTS": "4",
        "DOWNLOAD_DELAY": "5",  # the command line's 0.05 wins
        "PROXY_REST_SECONDS": "0",
        "PROXY_BAN_REST_SECONDS": "0",
        "PROXY_MAX_BAN_RETRIES": "1",
        "PROXY_ROTATE_EVERY": "1000",
    }
    try:
        for proxy in proxies:
            proxy.start()
        with Hub.open(hub) as h:
            ProxyPool(h).add([p.url for p in proxies])
            JobStore(h).create("live", "site", job_settings)
        # The first page is held in flight: the crawl cannot end before the change
        # reaches it, however fast the rest goes.
        pages = [f"{site.base_url}/hold/page/0.html"]
        pages += [f"{site.base_url}/page/{n}.html" for n in range(1, 150)]
        urls = write_urls(tmp_path / "urls.txt", pages)
        site.hold()
        log_path = tmp_path / "crawl.log"
        crawl = start_crawl(
            urls, data_dir, "-s", f"HUB_URL={hub}", "-s", "JOB=live", "-s",
            "JOB_REFRESH_SECONDS=0.2", "-s", "DOWNLOAD_DELAY=0.05", "-s", "ROBOTSTXT_OBEY=0",
            log_path=log_path,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while sum(len(p.requests_logged()) for p in proxies) < 20:
                assert time.monotonic() < deadline and crawl.poll() is None, log_path.read_text()
                time.sleep(0.05)
            changed = scrapy_with_hub(
                "job", "set", "live", f"PROXY_BAN_BODY_MARKERS={MARKER}",
                "CONCURRENT_REQUESTS=1", hub=hub,
            )  # fmt: skip
            assert changed.returncode == 0, changed.stderr
            wait_for_log(log_path, "CONCURRENT_REQUESTS '4' -> '1' (applied live)", crawl)
            site.release()
            try:
                status = crawl.wait(timeout=300)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the crawl did not end:\n{log_path.read_text()[-8000:]}")
            assert status == 0, log_path.read_text()[-5000:]
        finally:
            site.release()
            if crawl.poll() is None:
                crawl.kill()
                crawl.wait()
    finally:
        for proxy in proxies:
            proxy.stop()
    log = log_path.read_text()
    assert "Setting CONCURRENT_REQUESTS='4' from job live" in log
    assert "Setting DOWNLOAD_DELAY='0.05' from the command line (job live has '5')" in log
    applied = log.index("CONCURRENT_REQUESTS '4' -> '1' (applied live)")
    assert f"PROXY_BAN_BODY_MARKERS [] -> '{MARKER}' (applied live)" in log
    banned = [n for n in range(len(log)) if log.startswith("looks banned", n)]
    assert banned, "the new ban marker ended leases"
    assert min(banned) > applied, "no ban before the marker was set"
    assert "'job/settings_applied': 2" in log


def test_job_create_checks_its_url_list_as_a_crawl_does(tmp_path, hub_url):  # noqa: F811
    from crawler.hub import WorkQueue

    lines = [
        "http://example.org/1",
        "ftp://example.org/2",
        "# a comment",
        "",
        "http://example.org/3",
        "example.org/4",
        "http://exa mple.org/5",
    ]
    urls = write_urls(tmp_path / "urls.txt", lines)
    created = scrapy_with_hub(
        "job", "create", "news", "--spider", "site", "--urls", str(urls), hub=hub_url
    )
    assert created.returncode == 0, created.stderr
    assert "2 URLs added" in created.stdout, created.stdout
    # The crawl's own words for each bad line, with its file and line number.
    for number, problem in [
        (2, "not an absolute http(s) URL"),
        (6, "not an absolute http(s) URL"),
        (7, "contains white space"),
    ]:
        assert f"{urls}:{number}: {problem}: {lines[number - 1]!r}" in created.stderr
    with Hub.open(hub_url) as hub:
        assert WorkQueue(hub, "news", create=False).progress().total == 2


@deferred_f_from_coro_f
async def test_a_crawl_of_a_job_without_a_list_takes_the_jobs_queue(site, tmp_path, hub_url):  # noqa: F811
    from tests.checks import rows_by_url

    listed = [f"{site.base_url}/page/{n}.html" for n in range(200, 206)]
    urls = write_urls(tmp_path / "urls.txt", listed)
    created = scrapy_with_hub(
        "job", "create", "news", "--spider", "site", "--urls", str(urls), hub=hub_url
    )
    assert created.returncode == 0, created.stderr
    data_dir = tmp_path / "data"
    job = {"HUB_URL": hub_url, "JOB": "news", "CONCURRENT_REQUESTS": 1}
    # Stopped early (`scrapy crawl` would exit 75): its batch goes back to the queue,
    # for the next crawl.
    await crawl(SiteSpider, data_dir, {**job, "CLOSESPIDER_PAGECOUNT": 2}, status=75)
    with Hub.open(hub_url) as hub:
        assert "done 0/6" in JobAdmin(hub).show("news")
    await crawl(SiteSpider, data_dir, job)
    assert set(rows_by_url(data_dir)) == set(listed)
    shown = scrapy_with_hub("job", "show", "news", hub=hub_url)
    assert "done 6/6" in shown.stdout, shown.stdout


def test_a_job_crawl_s_batches_are_done_but_for_their_failed_urls(tmp_path, hub_url):  # noqa: F811
    # Three domains, a batch each, held by one crawl: at its end each batch is done and
    # the URLs its action log says failed (only this run's lines) go back to pending.
    from crawler.spiderkit.jobqueue import JobQueueUrls
    from crawler.spiderkit.start import listed_key
    from crawler.storage.actionlog import ActionLog

    listed = [f"http://d{d}.example/p/{n}" for d in range(3) for n in range(4)]
    urls = write_urls(tmp_path / "urls.txt", listed)
    created = scrapy_with_hub(
        "job", "create", "news", "--spider", "site", "--urls", str(urls), hub=hub_url
    )
    assert created.returncode == 0, created.stderr
    log_path = tmp_path / "actions.jsonl"
    log = ActionLog(log_path)
    log.write(listed[4], listed_key(listed[4])[1], "error")  # a run before this one
    since = log_path.stat().st_size
    queue = JobQueueUrls(hub_url, "news")
    leased = [url for batch in queue.batches(100) for _, url, _ in batch]
    assert sorted(leased) == sorted(listed) and len(queue.held) == 3
    failed = [listed[1], listed[9], listed[10]]
    for url in listed[:4] + listed[5:]:  # listed[4]: its error line is an earlier run's
        if url in (listed[2], listed[9]):
            log.write(url, listed_key(url)[1], "retry")
        log.write(url, listed_key(url)[1], "error" if url in failed else "ok")
    log.close()
    queue.finish(True, log_path, since)
    with Hub.open(hub_url) as hub:
        pending = hub.query("SELECT url FROM hub_work_items WHERE state = 'pending' ORDER BY url")
    assert [url for (url,) in pending] == sorted(failed)


def test_a_job_crawl_s_batches_found_stored_are_done_at_once_and_held_no_more(
    tmp_path,
    hub_url,  # noqa: F811
):
    # A resumed job: the batches its start finds stored whole are marked done before
    # the next lease, so that the crawl holds (in memory and in the hub) only the
    # batches it fetches.
    from crawler.hub import WorkQueue
    from crawler.spiderkit.jobqueue import JobQueueUrls

    listed = [f"http://d{d}.example/p/{n}" for d in range(3) for n in range(4)]
    urls = write_urls(tmp_path / "urls.txt", listed)
    created = scrapy_with_hub(
        "job", "create", "news", "--spider", "site", "--urls", str(urls), hub=hub_url
    )
    assert created.returncode == 0, created.stderr
    queue = JobQueueUrls(hub_url, "news")
    batches = queue.batches(4)  # a domain's four URLs a lease call
    next(batches), next(batches)
    first, second = queue.held
    assert queue.gone_through(True) and not queue.gone_through(False)
    assert queue.held == [second]
    next(batches)  # the next lease call marks the stored one done first
    third = queue.held[-1]
    with Hub.open(hub_url) as hub:
        ended = {lease["id"]: lease["end_reason"] for lease in WorkQueue(hub, "news").leases()}
    assert ended == {first.lease_id: "done", second.lease_id: None, third.lease_id: None}
    assert queue.held == [second, third]
    queue.finish(True)
    with Hub.open(hub_url) as hub:
        assert WorkQueue(hub, "news").progress().done == 12
