"""Every setting is checked once, the same way wherever its value comes from: ``-s``, the
environment, the project's settings module, ``scrapy job create|set``. A bad value is one
line naming it and exit 2 before anything is stored; a name nobody knows is warned of
with the closest known one (crawler/settingspecs.py)."""

from __future__ import annotations

import math

import pytest
from scrapy.settings import Settings

from crawler import settings as project
from crawler import settingspecs
from crawler.hub import Hub
from crawler.hub.jobs import JobStore
from tests.conftest import run_crawl, write_urls
from tests.hubs import scrapy_with_hub

# Values a hostile user tried (issue 45), each refused at a crawl's start and by `job set`.
BAD = [
    ("DOWNLOAD_DELAY", "nan"),
    ("DOWNLOAD_DELAY", "inf"),
    ("HOST_SLOT_TTL", "0"),
    ("ARCHIVE_PREFIX", "../../escape"),
    ("ARCHIVE_FORMAT", "tar"),
    ("ARCHIVE_DEDUP", "bogus"),
    ("CATALOG_STORE_STATUSES", "abc"),
    ("PROXY_BAN_STATUSES", "abc"),
    ("DUPEFILTER_MEMORY_FINGERPRINTS", "-1"),
    ("FEEDS", "{not json"),
    ("IMAGES_THUMBS", '{"small": [50]}'),
    ("CONCURRENT_REQUESTS", "0"),
]


def one_error(result, name: str) -> str:
    said = result.stdout + result.stderr
    assert result.returncode == 2, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: ") and name in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_bad_value_stops_a_crawl_at_its_start_with_one_line(site, tmp_path, name, value):
    data_dir = tmp_path / "data"
    urls = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/page/1.html"])
    one_error(run_crawl(urls, data_dir, "-s", f"{name}={value}"), name)
    assert not data_dir.exists()  # nothing started, nothing written


def test_a_job_refuses_each_bad_value_and_stores_nothing(tmp_path):
    hub = f"sqlite:///{tmp_path}/hub.db"
    assert scrapy_with_hub("job", "create", "j", "--spider", "site", hub=hub).returncode == 0
    for name, value in BAD:
        one_error(scrapy_with_hub("job", "set", "j", f"{name}={value}", hub=hub), name)
    with Hub.open(hub) as h:
        assert JobStore(h).get("j").settings == {}


def test_a_misspelt_name_is_warned_of_with_the_closest_one(site, tmp_path):
    urls = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/page/2.html"])
    crawled = run_crawl(urls, tmp_path / "data", "-s", "DOWNLOAD_DELYA=1")
    assert crawled.returncode == 0, crawled.stderr[-3000:]
    assert "DOWNLOAD_DELYA" in crawled.stderr and "did you mean DOWNLOAD_DELAY?" in crawled.stderr
    hub = f"sqlite:///{tmp_path}/hub.db"
    assert scrapy_with_hub("job", "create", "j", "--spider", "site", hub=hub).returncode == 0
    job = scrapy_with_hub("job", "set", "j", "HOST_SLOT_TTLL=40", hub=hub)
    assert job.returncode == 0, job.stderr
    assert "did you mean HOST_SLOT_TTL?" in job.stderr


def test_the_environment_and_the_project_settings_are_checked_as_s_is(site, tmp_path):
    urls = write_urls(tmp_path / "urls.txt", [f"{site.base_url}/page/3.html"])
    data_dir = tmp_path / "data"
    bad_hub = run_crawl(urls, data_dir, env={**_env(), "HUB_URL": "mysql://u:hunter2@db/x"})
    assert "hunter2" not in one_error(bad_hub, "HUB_URL")
    # A project whose settings module holds a bad value.
    module = tmp_path / "badsettings.py"
    module.write_text("from crawler.settings import *\nDOWNLOAD_DELAY = float('nan')\n")
    env = {**_env(), "SCRAPY_SETTINGS_MODULE": "badsettings"}
    env["PYTHONPATH"] += f":{tmp_path}"
    one_error(run_crawl(urls, data_dir, env=env), "DOWNLOAD_DELAY")
    assert not data_dir.exists()


def test_a_bad_proxy_url_is_a_usage_error(tmp_path):
    added = scrapy_with_hub("proxies", "add", "notaurl", hub=f"sqlite:///{tmp_path}/hub.db")
    assert added.returncode == 2 and "notaurl" in added.stderr, added.stderr


def _env() -> dict:
    from tests.conftest import crawl_env

    return crawl_env()


# -- the declarations themselves -----------------------------------------------------------


def test_every_project_setting_is_declared_and_its_default_passes():
    names = {name for name in vars(project) if name.isupper() and not name.startswith("_")}
    assert names - set(settingspecs.SPECS) == set()
    defaults = Settings()
    defaults.setmodule(project)
    checked = {name: settingspecs.check_value(name, defaults[name], defaults) for name in names}
    settingspecs.check_combinations(checked.get)
    assert checked["CATALOG_STORE_STATUSES"][:2] == [200, 201]


def test_values_are_read_as_scrapy_reads_them():
    check = settingspecs.check_value
    assert check("DOWNLOAD_DELAY", "0.5") == 0.5
    assert check("ROBOTSTXT_OBEY", "False") is False and check("ROBOTSTXT_OBEY", 1) is True
    assert check("PROXY_BAN_STATUSES", "403, 429") == [403, 429]
    assert check("FEEDS", '{"o.jsonl": {"format": "jsonl"}}') == {"o.jsonl": {"format": "jsonl"}}
    assert check("ARCHIVE_FORMAT", "ZIP") == "zip"
    assert check("HUB_URL", None) is None
    for name, value in [("DOWNLOAD_DELAY", math.nan), ("RETRY_TIMES", "1.5"), ("LOG_LEVEL", "x")]:
        with pytest.raises(settingspecs.SettingValueError, match=name):
            check(name, value, {"RETRY_TIMES": 2})


def test_the_declarations_and_the_job_checks_import_no_scrapy():
    """The hub checks job settings with the declarations: neither may need Scrapy."""
    import subprocess
    import sys

    from tests.conftest import ROOT, crawl_env
    from tests.test_storage_imports import BLOCKED_IMPORT

    modules = ["crawler.settingspecs", "crawler.hub.jobchecks"]
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT, *modules],
        cwd=ROOT, env=crawl_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
