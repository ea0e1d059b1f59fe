"""A job's settings are checked when they are set (``scrapy job``), and a crawl that
meets a bad value in the hub anyway skips that setting, not the whole job."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from crawler.hub import Hub
from crawler.hub.jobchecks import JobSettingError, check_settings
from crawler.hub.jobs import JobStore, parse_assignments
from tests.conftest import run_crawl, start_crawl, write_urls
from tests.hubs import hub_url, scrapy_with_hub  # noqa: F401 - hub_url: a fixture
from tests.polling import wait_until


def one_line(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def job_settings(hub: str, name: str) -> tuple[int, dict[str, str]]:
    with Hub.open(hub) as h:
        job = JobStore(h).get(name)
    return job.version, job.settings


REFUSED = [
    ("CONCURRENT_REQUESTS=abc", ("CONCURRENT_REQUESTS", "'abc'", "integer")),
    ("DOWNLOAD_DELAY=fast", ("DOWNLOAD_DELAY", "'fast'", "number")),
    ("ROBOTSTXT_OBEY=maybe", ("ROBOTSTXT_OBEY", "'maybe'", "true or false")),
    ("CONCURRENT_REQUESTS=0", ("CONCURRENT_REQUESTS", "at least 1")),
    ("DATA_DIR=/tmp/elsewhere", ("DATA_DIR", "where a crawl reads and writes", "-s")),
    ("HUB_URL=sqlite:///other.db", ("HUB_URL", "where a crawl reads and writes")),
    ("JOB=other", ("JOB", "where a crawl reads and writes")),
]


def project_defaults() -> Settings:
    """The defaults ``scrapy job`` checks against: Scrapy's and the project's."""
    settings = Settings()
    settings.setmodule("crawler.settings", priority="project")
    return settings


@pytest.mark.parametrize("assignment, words", REFUSED)
def test_a_bad_value_is_refused_naming_the_setting_and_what_it_takes(assignment, words):
    with pytest.raises(JobSettingError) as refused:
        check_settings(parse_assignments([assignment]), project_defaults())
    assert all(word in str(refused.value) for word in words), str(refused.value)
    # Beside a good value, the command is refused all the same.
    with pytest.raises(JobSettingError):
        check_settings(
            parse_assignments(["CONCURRENT_REQUESTS_PER_DOMAIN=2", assignment]),
            project_defaults(),
        )


def test_job_set_refuses_a_bad_value_with_one_line_and_stores_nothing(tmp_path):
    # Refused before the hub is opened: one backend says it (the hub's own tests and the
    # good values below run on both).
    hub = f"sqlite:///{tmp_path}/hub.db"
    created = scrapy_with_hub("job", "create", "j", "--spider", "site", hub=hub)
    assert created.returncode == 0, created.stderr
    before = job_settings(hub, "j")
    (bad, bad_words), (place, place_words) = REFUSED[0], REFUSED[4]
    for args, words in (
        ([bad], bad_words),
        (["CONCURRENT_REQUESTS_PER_DOMAIN=2", bad], bad_words),  # nothing of it stored
        ([place], place_words),
    ):
        result = scrapy_with_hub("job", "set", "j", *args, hub=hub)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        line = one_line(result)
        assert line.startswith("error: ") and all(word in line for word in words), line
        assert job_settings(hub, "j") == before
    refused = scrapy_with_hub(
        "job", "create", "k", "--spider", "site", "-s", REFUSED[1][0], hub=hub
    )
    assert refused.returncode == 2 and "DOWNLOAD_DELAY" in one_line(refused)
    with Hub.open(hub) as h:
        assert [job.name for job in JobStore(h).jobs()] == ["j"]


def test_job_set_stores_good_values_and_warns_of_unknown_names(hub_url):  # noqa: F811
    assert scrapy_with_hub("job", "create", "j", "--spider", "site", hub=hub_url).returncode == 0
    result = scrapy_with_hub(
        "job", "set", "j", "DOWNLOAD_DELAY=0.5", "CONCURRENT_REQUESTS=4",
        "ROBOTSTXT_OBEY=False", "PROXY_BAN_STATUSES=403,429", "MY_SPIDER_PAGES=12", hub=hub_url,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warning = one_line(result)
    assert "MY_SPIDER_PAGES" in warning and "not a setting" in warning, warning
    assert job_settings(hub_url, "j") == (
        2,
        {
            "CONCURRENT_REQUESTS": "4",
            "DOWNLOAD_DELAY": "0.5",
            "MY_SPIDER_PAGES": "12",
            "PROXY_BAN_STATUSES": "403,429",
            "ROBOTSTXT_OBEY": "False",
        },
    )


def test_a_crawl_skips_a_bad_value_in_the_hub_and_applies_the_rest(
    site,
    tmp_path,
    data_dir,
    hub_url,  # noqa: F811
):
    # Values that `scrapy job set` refuses, written as an older version of it would.
    with Hub.open(hub_url) as h:
        JobStore(h).create(
            "bad", "site", {"CONCURRENT_REQUESTS": "abc", "DATA_DIR": str(tmp_path / "elsewhere")}
        )
    args = ("-s", f"HUB_URL={hub_url}", "-s", "JOB=bad", "-s", "PROXY_ENABLED=0")
    args += ("-s", "ROBOTSTXT_OBEY=0", "-s", "JOB_REFRESH_SECONDS=0.1")
    few = write_urls(tmp_path / "few.txt", [f"{site.base_url}/page/{n}.html" for n in range(3)])
    started = run_crawl(few, data_dir, *args)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "Traceback" not in started.stderr, started.stderr[-3000:]
    for word in ("CONCURRENT_REQUESTS", "'abc'", "DATA_DIR", "job bad"):
        assert word in started.stderr, started.stderr[-3000:]
    assert not (tmp_path / "elsewhere").exists()
    assert (data_dir / "metadata.db").exists()

    # A running crawl: a bad value is skipped (said once), a later good one applied.
    many = [f"{site.base_url}/page/{n}.html" for n in range(3, 200)]
    log_path = tmp_path / "crawl.log"
    crawl = start_crawl(
        write_urls(tmp_path / "many.txt", many), data_dir, *args,
        "-s", "DOWNLOAD_DELAY=0.05", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1",
        log_path=log_path,
    )  # fmt: skip
    try:
        wait_until(
            lambda: "Spider opened" in log_path.read_text(), "the crawl to start", proc=crawl
        )
        with Hub.open(hub_url) as h:
            JobStore(h).set("bad", {"DOWNLOAD_TIMEOUT": "soon"})
        wait_until(lambda: "'soon'" in log_path.read_text(), "the bad value's word", proc=crawl)
        with Hub.open(hub_url) as h:
            JobStore(h).set("bad", {"CONCURRENT_REQUESTS": "8"})
        wait_until(
            lambda: (
                "CONCURRENT_REQUESTS" in log_path.read_text().split("'soon'", 1)[1]
                and "applied live" in log_path.read_text()
            ),
            "the good value applied",
            proc=crawl,
        )
        assert crawl.wait(timeout=300) == 0, log_path.read_text()[-5000:]
    finally:
        if crawl.poll() is None:
            crawl.kill()
            crawl.wait()
    log = log_path.read_text()
    assert "Traceback" not in log, log[-5000:]
    assert log.count("'soon'") == 1, log[-5000:]
    assert log.count("'abc'") == 1, log[-5000:]
    assert "CONCURRENT_REQUESTS 'abc' -> '8' (applied live)" in log or (
        "CONCURRENT_REQUESTS" in log and "'8' (applied live)" in log
    ), log[-5000:]
